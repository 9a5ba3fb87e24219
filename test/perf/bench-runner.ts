import { HttpStreamClient } from '../../plugins/benchmarks/http-stream.ts'
import type { RequestSample } from '../../plugins/benchmarks/request.ts'
import { runScenarioLoad } from '../../plugins/benchmarks/runner.ts'
import { percentile, ScenarioRecorder } from '../../plugins/benchmarks/statistics.ts'
import { type StubRecord, spawnStub } from './bench-stub.ts'

/**
 * bench-runner measures the benchmark runner itself (`npm run bench:runner`). It drives a stub
 * engine (test/perf/bench-stub-engine.ts, its own process, raw TCP, stamping request arrival and
 * chunk writes) at concurrency 64, 256 and 1024 and prints:
 *
 * - TTFT error = runner-measured TTFT − stub-side TTFT (first content chunk written − request
 *   bytes arrived). It is everything the runner adds: request write + delivery, first-chunk
 *   delivery and the runner's own stamping delay. Needs no shared clock.
 * - its split into request lag and first-chunk lag (these two use both processes' timeOrigin-based
 *   epoch clocks, so they carry a few µs of clock offset);
 * - the runner's achieved chunk throughput and CPU use.
 *
 * Steady state leaves out the first wave of `concurrency` requests (they all start in the same
 * millisecond). The stub adds a uniform 0–20 ms jitter to its 20 ms TTFT so streams do not stay in
 * lock-step (`--sync` turns that off). `--pin` puts the runner on CPU 0 and the stub on CPU 1 with
 * taskset. Each level runs `--reps` times (default 3); the summary line gives the median of the
 * repetitions' p99s. "stalls" counts event-loop turns of the runner longer than 3 ms during the
 * run (a 1 ms interval timer), which tells a runner hiccup (GC, or the CPU taken by another
 * process on a shared machine) from a slow stub.
 *
 *   bun test/perf/bench-runner.ts [--quick] [--sync] [--reps N] [--pin]
 *
 * Target: steady-state TTFT error p99 ≤ 1 ms at 256 concurrent streams on a 2-core machine.
 */
const argv = process.argv.slice(2)
const quick = argv.includes('--quick')
const sync = argv.includes('--sync')
const reps = Number(argv[argv.indexOf('--reps') + 1]) || (quick ? 1 : 3)
const pin = argv.includes('--pin') && Bun.which('taskset') !== null && navigator.hardwareConcurrency >= 2

interface Level {
  name: string
  concurrency: number
  tokensPerSec: number
  outputTokens: number
  waves: number
}

const LEVELS: Level[] = [
  { name: 'c64', concurrency: 64, tokensPerSec: 100, outputTokens: 32, waves: 4 },
  { name: 'c256', concurrency: 256, tokensPerSec: 50, outputTokens: 32, waves: 4 },
  { name: 'c1024', concurrency: 1024, tokensPerSec: 12, outputTokens: 12, waves: 3 },
  // saturation: how many chunks per second the runner takes in when the stub sends as fast as it can
  { name: 'c256-saturate', concurrency: 256, tokensPerSec: 2000, outputTokens: 200, waves: 2 },
]

const fmt = (v: number) => v.toFixed(3).padStart(7)

interface Figures {
  p50: number
  p99: number
  max: number
  reqP99: number
  chunkP99: number
  chunksPerSec: number
  cpu: number
  failed: number
  stalls: number
  maxStall: number
}

async function measure(l: Level): Promise<Figures> {
  const stub = await spawnStub({
    ttftMs: 20,
    ttftJitterMs: sync ? 0 : 20,
    tokensPerSec: l.tokensPerSec,
    cpus: pin ? '1' : undefined,
  })
  const client = new HttpStreamClient()
  try {
    const total = l.concurrency * (quick ? 2 : l.waves)
    const recorder = new ScenarioRecorder({ e2eMs: null, ttftMs: null, tpotMs: null })
    const samples: { id: string; s: RequestSample; order: number }[] = []
    const body = JSON.stringify({
      model: 'stub',
      prompt: 'the quick brown fox jumps over the lazy dog '.repeat(4),
      max_tokens: l.outputTokens,
      ignore_eos: true,
      stream: true,
      stream_options: { include_usage: true },
    })
    let order = 0
    const gaps: number[] = []
    let last = performance.now()
    const monitor = setInterval(() => {
      const now = performance.now()
      gaps.push(now - last)
      last = now
    }, 1)
    const cpu0 = process.cpuUsage()
    const wall0 = performance.now()
    const outcome = await runScenarioLoad(
      client,
      {
        url: new URL(`${stub.url}/v1/completions`),
        headers: {},
        body: () => body,
        requestIdPrefix: l.name,
        concurrency: l.concurrency,
        warmupRequests: l.concurrency,
        totalRequests: total,
        requestRate: null,
        requestTimeoutMs: 120_000,
      },
      recorder,
      new AbortController().signal,
      { sample: (s, id) => samples.push({ id, s, order: order++ }) },
    )
    const cpu = process.cpuUsage(cpu0)
    clearInterval(monitor)
    const wallSec = (performance.now() - wall0) / 1000
    const stats: Record<string, StubRecord> = await stub.stats()
    const steady = samples.filter((x) => x.s.ok && stats[x.id] && x.order >= l.concurrency)
    const sorted = (f: (x: (typeof steady)[number]) => number) => steady.map(f).sort((a, b) => a - b)
    const origin = performance.timeOrigin
    const error = sorted((x) => x.s.ttftMs - stats[x.id]!.ttft_ms)
    const reqLag = sorted((x) => stats[x.id]!.arrived_epoch - (origin + x.s.sendAt))
    const chunkLag = sorted((x) => origin + x.s.sendAt + x.s.ttftMs - stats[x.id]!.first_sent_epoch)
    const chunks = samples.reduce((n, x) => n + x.s.contentChunks, 0)
    return {
      p50: percentile(error, 50),
      p99: percentile(error, 99),
      max: error.at(-1) ?? 0,
      reqP99: percentile(reqLag, 99),
      chunkP99: percentile(chunkLag, 99),
      chunksPerSec: chunks / outcome.durationSec,
      cpu: ((cpu.user + cpu.system) / 1e6 / wallSec) * 100,
      failed: samples.filter((x) => !x.s.ok).length,
      stalls: gaps.filter((g) => g > 3).length,
      maxStall: Math.max(0, ...gaps),
    }
  } finally {
    client.close()
    stub.stop()
  }
}

if (pin) Bun.spawnSync(['taskset', '-a', '-p', '-c', '0', String(process.pid)], { stdout: 'ignore' })
console.log(
  `bench-runner: Bun ${Bun.version}, ${navigator.hardwareConcurrency} cores, ${pin ? 'runner on CPU 0, stub on CPU 1' : 'unpinned'}, ` +
    `stub TTFT 20 ms${sync ? '' : ' + U(0, 20) ms'}, ${reps} repetition(s); times in ms, steady state`,
)
for (const l of LEVELS) {
  if (quick && l.name.endsWith('saturate')) continue
  const runs: Figures[] = []
  for (let r = 0; r < reps; r++) {
    const f = await measure(l)
    runs.push(f)
    console.log(
      `  ${l.name.padEnd(14)} #${r + 1} TTFT error p50 ${fmt(f.p50)} p99 ${fmt(f.p99)} max ${fmt(f.max)} | ` +
        `request lag p99 ${fmt(f.reqP99)} first-chunk lag p99 ${fmt(f.chunkP99)} | ` +
        `${Math.round(f.chunksPerSec)} chunks/s, runner CPU ${Math.round(f.cpu)}%, stalls ${f.stalls} (max ${f.maxStall.toFixed(1)})` +
        `${f.failed ? `, ${f.failed} failed` : ''}`,
    )
  }
  const med = (f: (x: Figures) => number) =>
    percentile(
      runs.map(f).sort((a, b) => a - b),
      50,
    )
  console.log(
    `${l.name.padEnd(16)} median of ${reps}: TTFT error p50 ${fmt(med((f) => f.p50))} p99 ${fmt(med((f) => f.p99))} | ` +
      `${Math.round(med((f) => f.chunksPerSec))} chunks/s | runner CPU ${Math.round(med((f) => f.cpu))}% ` +
      `(${l.concurrency} streams × ${l.tokensPerSec} tok/s)`,
  )
}
