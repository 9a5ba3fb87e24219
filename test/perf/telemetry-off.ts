/**
 * telemetry-off: what the request path pays for tracing when it is off. The request path calls
 * `telemetry.requestSpan(head)` once per request and skips every span call when it answers null;
 * this measures that call against an empty function in the same run, and the heap it allocates.
 * `npx bun test/perf/telemetry-off.ts` (results in test/perf/README.md).
 */
import { Telemetry } from '../../src/host/telemetry/telemetry.ts'

const N = 20_000_000
const head = { method: 'POST', route: '/v1/chat/completions', traceparent: null, model: 'm' }
const telemetry = Telemetry.OFF as Telemetry
let sink = 0
const baseline = (h: typeof head): null => (h.model.length > 1e9 ? null : null)

function run(label: string, f: () => void): number {
  Bun.gc(true)
  const heap = process.memoryUsage().heapUsed
  const t0 = Bun.nanoseconds()
  f()
  const ns = (Bun.nanoseconds() - t0) / N
  const grew = process.memoryUsage().heapUsed - heap
  console.log(
    `${label.padEnd(34)} ${ns.toFixed(2)} ns/call  heap +${Math.round(grew / 1024)} KiB over ${N / 1e6}M calls`,
  )
  return ns
}

for (let round = 0; round < 3; round++) {
  const base = run('empty function (baseline)', () => {
    for (let i = 0; i < N; i++) if (baseline(head) !== null) sink++
  })
  const off = run('Telemetry.OFF.requestSpan(head)', () => {
    for (let i = 0; i < N; i++) {
      const t = telemetry.requestSpan(head)
      if (t !== null) {
        t.firstToken()
        t.end(200)
        sink++
      }
    }
  })
  console.log(`round ${round + 1}: off costs ${(off - base).toFixed(2)} ns per request over the baseline\n`)
}
if (sink) console.log(sink)
