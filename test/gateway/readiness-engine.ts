/**
 * A stand-in engine for the readiness tests (test/gateway/metrics.test.ts, engine-ports.test.ts): it
 * answers GET /health 200 on `--port`, and GET /v1/models with its `--served-model-name` (or SERVED_AS,
 * to play an engine serving something else), and nothing else. READY_LINE says what it prints of
 * uvicorn's start-up:
 * - `early`: `INFO:     Application startup complete.` first, and opens its port LINE_LEAD_MS
 *   (default 150) later, as an engine whose line precedes its socket by a moment;
 * - `none`: no line at all (an engine whose output is not uvicorn's), its port open at once.
 */
const args = process.argv.slice(2)
const flag = (name: string) => {
  const i = args.indexOf(name)
  return i >= 0 ? args[i + 1] : undefined
}
const port = Number(flag('--port'))
const hostname = flag('--host') ?? '127.0.0.1'
const served = process.env['SERVED_AS'] ?? flag('--served-model-name') ?? args[0]
const mode = process.env['READY_LINE'] ?? 'early'
const leadMs = Number(process.env['LINE_LEAD_MS'] ?? 150)

const serve = () =>
  Bun.serve({
    hostname,
    port,
    fetch: (req) => {
      const path = new URL(req.url).pathname
      if (path === '/health') return new Response(null)
      if (path === '/v1/models')
        return Response.json({ object: 'list', data: [{ id: served, object: 'model' }] })
      return new Response('not found', { status: 404 })
    },
  })

if (mode === 'early') {
  process.stderr.write('INFO:     Application startup complete.\n')
  setTimeout(serve, leadMs)
} else serve()

process.on('SIGTERM', () => process.exit(0))
