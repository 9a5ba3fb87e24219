/**
 * proxy-stream-client opens N concurrent chat-completion streams against a URL and measures, for
 * every chunk, arrival time minus the send time the stub wrote into it (`"t"`, wall-clock
 * ms), i.e. the delay added on the way. Run in its own process (with a raised
 * BUN_CONFIG_MAX_HTTP_REQUESTS, as fetch caps a process at 256 requests in flight) so the client
 * load does not share an event loop with what it measures. Prints one JSON line of results.
 *
 *   bun test/perf/proxy-stream-client.ts --url URL --streams N [--deadline-ms 30000] [--header 'name: value']
 */
const args = process.argv.slice(2)
const arg = (name: string, fallback?: string) => {
  const i = args.indexOf(name)
  return i >= 0 ? args[i + 1]! : fallback!
}
const url = arg('--url')
const streams = Number(arg('--streams', '256'))
const deadlineMs = Number(arg('--deadline-ms', '30000'))
/** --header 'name: value' (repeatable): sent with every request (an inference key). */
const headers: Record<string, string> = { 'content-type': 'application/json' }
for (let i = 0; i < args.length; i++)
  if (args[i] === '--header') {
    const [name, ...value] = args[++i]!.split(':')
    headers[name!.trim().toLowerCase()] = value.join(':').trim()
  }
const body = JSON.stringify({
  model: 'bench-model',
  stream: true,
  messages: [{ role: 'user', content: 'hi' }],
})

const nowMs = () => performance.timeOrigin + performance.now()
const delays = new Float64Array(streams * 80)
let samples = 0
let completed = 0
let errors = 0
const firstError: string[] = []
const deadline = AbortSignal.timeout(deadlineMs)

async function one(): Promise<void> {
  try {
    const res = await fetch(url, {
      method: 'POST',
      headers,
      body,
      signal: deadline,
    })
    if (res.status !== 200) throw new Error(`status ${res.status}`)
    const decoder = new TextDecoder()
    let done = false
    for await (const chunk of res.body!) {
      const now = nowMs()
      const text = decoder.decode(chunk, { stream: true })
      let i = text.indexOf('"t":')
      while (i >= 0) {
        const end = text.indexOf('}', i)
        if (samples < delays.length) delays[samples++] = now - Number(text.slice(i + 4, end))
        i = text.indexOf('"t":', end)
      }
      if (text.includes('[DONE]')) done = true
    }
    if (!done) throw new Error('stream ended without [DONE]')
    completed++
  } catch (err) {
    errors++
    if (firstError.length < 3) firstError.push(String(err).slice(0, 120))
  }
}

const t0 = nowMs()
await Promise.all(Array.from({ length: streams }, one))
const sorted = delays.subarray(0, samples).sort()
const pct = (p: number) =>
  samples ? sorted[Math.min(samples - 1, Math.floor((p / 100) * samples))]! : Number.NaN
process.stdout.write(
  `${JSON.stringify({
    streams,
    completed,
    errors,
    samples,
    p50: pct(50),
    p99: pct(99),
    max: samples ? sorted[samples - 1] : Number.NaN,
    wall_ms: nowMs() - t0,
    first_errors: firstError,
  })}\n`,
)
process.exit(0)

export {}
