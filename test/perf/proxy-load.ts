/**
 * proxy-load is the non-streaming load generator used when `wrk` is not installed: C keep-alive
 * connections each sending the same chat-completion POST back to back for a bounded duration.
 * Prints one JSON line `{requests, errors, rps, p50_us, p99_us}`.
 *
 *   bun test/perf/proxy-load.ts --url URL --concurrency C --duration-ms D [--header 'name: value']
 */
const args = process.argv.slice(2)
const arg = (name: string, fallback?: string) => {
  const i = args.indexOf(name)
  return i >= 0 ? args[i + 1]! : fallback!
}
const url = arg('--url')
const concurrency = Number(arg('--concurrency', '1'))
const durationMs = Number(arg('--duration-ms', '4000'))
const body = JSON.stringify({ model: 'bench-model', messages: [{ role: 'user', content: 'hi' }] })
/** --header 'name: value' (repeatable): sent with every request (an inference key). */
const headers: Record<string, string> = { 'content-type': 'application/json' }
for (let i = 0; i < args.length; i++)
  if (args[i] === '--header') {
    const [name, ...value] = args[++i]!.split(':')
    headers[name!.trim().toLowerCase()] = value.join(':').trim()
  }

const latencies: number[] = []
let errors = 0
const end = performance.now() + durationMs

async function worker(): Promise<void> {
  while (performance.now() < end) {
    const t = performance.now()
    try {
      const res = await fetch(url, { method: 'POST', headers, body })
      await res.arrayBuffer()
      if (res.status !== 200) errors++
      else latencies.push(performance.now() - t)
    } catch {
      errors++
    }
  }
}

const t0 = performance.now()
await Promise.all(Array.from({ length: concurrency }, worker))
const wall = performance.now() - t0
latencies.sort((a, b) => a - b)
const pct = (p: number) =>
  latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] ?? Number.NaN
process.stdout.write(
  `${JSON.stringify({
    requests: latencies.length,
    errors,
    rps: (latencies.length / wall) * 1000,
    p50_us: pct(50) * 1000,
    p99_us: pct(99) * 1000,
  })}\n`,
)
process.exit(0)

export {}
