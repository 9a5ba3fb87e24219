/**
 * otlp-sink is the OTLP/HTTP collector of the proxy benchmark's traced column, in its own process
 * (never the proxy's event loop): it takes `POST /v1/traces` (OTLP JSON) and counts the spans in
 * each export by their `"spanId"` keys without decoding the rest, so that on a shared 2-core box
 * the collector's own work weighs as little as it can on what is measured: modelgate's cost of
 * tracing (a real collector runs elsewhere). Prints one JSON line `{url, pid}` on stdout once
 * listening; `GET /count` answers `{spans, exports}`; stops on SIGTERM.
 *
 *   bun test/perf/otlp-sink.ts
 */
const SPAN_ID = Buffer.from('"spanId":')
let spans = 0
let exported = 0

const server = Bun.serve({
  hostname: '127.0.0.1',
  port: 0,
  async fetch(req) {
    const url = new URL(req.url)
    if (req.method === 'GET' && url.pathname === '/count') return Response.json({ spans, exports: exported })
    if (req.method !== 'POST' || url.pathname !== '/v1/traces')
      return new Response('not found', { status: 404 })
    const body = Buffer.from(await req.arrayBuffer())
    for (let at = body.indexOf(SPAN_ID); at >= 0; at = body.indexOf(SPAN_ID, at + SPAN_ID.length)) spans++
    exported++
    return Response.json({ partialSuccess: {} })
  },
})
process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${server.port}`, pid: process.pid })}\n`)

const shutdown = () => {
  server.stop(true)
  process.exit(0)
}
process.on('SIGTERM', shutdown)
process.on('SIGINT', shutdown)

export {}
