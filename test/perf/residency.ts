import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { numberArg, stringArg } from './args.ts'
import { type LiveOutcome, type LivePolicy, runLive } from './residency-live.ts'
import { pct, type ReplayModel, type ReplayOutcome, type ReplayPolicy, replay } from './residency-replay.ts'
import { DEFAULT_TRACE, generateTrace, type TraceOptions } from './residency-trace.ts'

/**
 * bench:residency: seeded traces (residency-trace.ts) replayed under each policy, in virtual time
 * (residency-replay.ts: the real residency manager on a virtual clock and a model of the engine
 * with vLLM's published durations), so the same seeds give the same figures on any machine, in
 * seconds. Policies: `cost` (the default), `lru` (unload the least recently used, what llama-swap
 * and Ollama do), `lru-sleep` (the LRU victim sleeps at level 1 while host RAM allows, else it is
 * unloaded), `static` (the first three loaded at start, the others refused) and `clairvoyant`
 * (the bound: it knows every future request and evicts the model asked for farthest ahead).
 *
 * Shapes (2 × 80 GB GPUs; models claim 36 or 56 GiB, gpu_memory_utilization 0.45 or 0.7):
 *   shipped  6 models, Zipf 1.1, bursts, the popular set reversed halfway (issue 30's trace)
 *   flat     8 models (more than fit), Zipf 0.8, no shift
 *   burst    6 models at twice the rate (1.0/s), a burst every 120 s
 * Every policy starts warm: the first three models loaded and serving when the trace begins.
 *
 * Printed per trace: each policy's requests served and failed, time to first token p50/p95/p99,
 * cold loads, wakes, sleeps, unloads, GPU-memory GiB·h; then one line per trace of cost's p99
 * against lru's, lru-sleep's and the bound's, the median of those ratios over the traces, and the
 * goals (issue 42): 0 failed for cost, median cost/lru ≤ 0.5, median cost/lru-sleep ≤ 0.8, on no
 * trace worse than lru-sleep, cost p99 ≤ 1.5 × the bound's, cost p50 within 1 s of it.
 *
 *   npx bun test/perf/residency.ts [--seeds 20261127,1,2,3,4,5,6,7] [--shapes shipped,flat,burst]
 *     [--minutes 30] [--rate R] [--zipf S] [--burst-every S] [--burst-seconds S] [--burst-factor F]
 *     [--no-shift] [--policies cost,lru,lru-sleep,static,clairvoyant] [--dump DIR]
 *     [--live [--scale 0.2]]   (also the wall-clock run against the real gateway and simulator,
 *                               on the first trace, printed beside the replay of the same trace)
 */
const SEEDS = stringArg('--seeds', '20261127,1,2,3,4,5,6,7').split(',').map(Number)
const SHAPES = stringArg('--shapes', 'shipped,flat,burst').split(',')
const POLICIES = stringArg('--policies', 'cost,lru,lru-sleep,static,clairvoyant').split(',') as ReplayPolicy[]
const DUMP = stringArg('--dump', '')
const LIVE = process.argv.includes('--live')
const SCALE = numberArg('--scale', 0.2)

const SIX: ReplayModel[] = [
  { name: 'alpha-8b', util: 0.45 },
  { name: 'bravo-7b', util: 0.45 },
  { name: 'charlie-14b', util: 0.7 },
  { name: 'delta-3b', util: 0.45 },
  { name: 'echo-13b', util: 0.7 },
  { name: 'foxtrot-1.5b', util: 0.45 },
]
const EIGHT: ReplayModel[] = [...SIX, { name: 'golf-8b', util: 0.45 }, { name: 'hotel-13b', util: 0.7 }]

type Shape = { models: ReplayModel[]; trace: Omit<TraceOptions, 'models' | 'seed'> }
const SHAPE: Record<string, Shape> = {
  shipped: { models: SIX, trace: { ...DEFAULT_TRACE } },
  flat: { models: EIGHT, trace: { ...DEFAULT_TRACE, zipfS: 0.8, shift: false } },
  burst: { models: SIX, trace: { ...DEFAULT_TRACE, ratePerSecond: 1.0, burstEverySeconds: 120 } },
}

/** The trace generator's options from the command line, over every shape's own. */
function overrides(): Partial<TraceOptions> {
  const o: Partial<TraceOptions> = {}
  const n = (flag: string, key: keyof TraceOptions) => {
    if (process.argv.includes(flag)) (o as Record<string, number>)[key] = numberArg(flag, 0)
  }
  n('--minutes', 'minutes')
  n('--rate', 'ratePerSecond')
  n('--zipf', 'zipfS')
  n('--burst-every', 'burstEverySeconds')
  n('--burst-seconds', 'burstSeconds')
  n('--burst-factor', 'burstFactor')
  if (process.argv.includes('--no-shift')) o.shift = false
  return o
}

const f = (x: number) => (Number.isNaN(x) ? '—' : x.toFixed(2))
const median = (xs: number[]) =>
  pct(
    xs.filter((x) => Number.isFinite(x)),
    0.5,
  )

function table(rows: (ReplayOutcome | (LiveOutcome & { counts?: undefined }))[], label = ''): void {
  console.log(
    `\n| policy${label} | served | failed | TTFT p50 s | p95 s | p99 s | cold loads | wakes | sleeps | unloads | GPU-memory GiB·h |`,
  )
  console.log('|---|---|---|---|---|---|---|---|---|---|---|')
  for (const r of rows) {
    const c = r.counts
    const gib = 'gpuMemoryGibHours' in r ? r.gpuMemoryGibHours : r.gpuMemoryHours
    console.log(
      `| ${r.policy} | ${r.served} | ${r.failed} | ${f(pct(r.ttft, 0.5))} | ${f(pct(r.ttft, 0.95))} | ${f(pct(r.ttft, 0.99))} | ` +
        `${c ? c.coldLoads : (r as LiveOutcome).coldLoads} | ${c ? c.wakes : (r as LiveOutcome).wakes} | ` +
        `${c ? c.sleeps : '—'} | ${c ? c.unloads : '—'} | ${gib.toFixed(1)} |`,
    )
  }
  for (const r of rows)
    if (r.failures.size) console.log(`  ${r.policy} failures: ${JSON.stringify([...r.failures])}`)
}

const over = overrides()
const summary: {
  trace: string
  requests: number
  by: Map<ReplayPolicy, ReplayOutcome>
}[] = []
const wall0 = performance.now()
console.log(
  `bench:residency (virtual time): shapes ${SHAPES.join(', ')} × seeds ${SEEDS.join(', ')}; ` +
    `policies ${POLICIES.join(', ')}${Object.keys(over).length ? `; trace options ${JSON.stringify(over)}` : ''}`,
)
for (const shapeName of SHAPES) {
  const shape = SHAPE[shapeName]
  if (!shape) throw new Error(`unknown shape ${shapeName} (known: ${Object.keys(SHAPE).join(', ')})`)
  for (const seed of SEEDS) {
    const opts = { ...shape.trace, ...over, seed, models: shape.models.map((m) => m.name) }
    const trace = generateTrace(opts)
    const name = `${shapeName} seed ${seed}`
    const by = new Map<ReplayPolicy, ReplayOutcome>()
    for (const policy of POLICIES) {
      const r = await replay(policy, trace, { models: shape.models, gpus: 2, preload: 3, residency: {} })
      by.set(policy, r)
      if (DUMP) {
        mkdirSync(DUMP, { recursive: true })
        writeFileSync(
          join(DUMP, `${shapeName}-${seed}-${policy}.json`),
          JSON.stringify({ requests: r.requests, decisions: r.decisions }, null, 1),
        )
      }
    }
    summary.push({ trace: name, requests: trace.length, by })
    console.log(`\n### ${name}: ${trace.length} requests over ${opts.minutes} simulated minutes`)
    table([...by.values()])
  }
}

const p99 = (r?: ReplayOutcome) => (r ? pct(r.ttft, 0.99) : Number.NaN)
const p50 = (r?: ReplayOutcome) => (r ? pct(r.ttft, 0.5) : Number.NaN)
console.log(
  '\n| trace | cost p99 s | lru p99 s | lru-sleep p99 s | bound p99 s | cost/lru | cost/lru-sleep | cost/bound | cost p50 s | bound p50 s | failed cost / lru / lru-sleep |',
)
console.log('|---|---|---|---|---|---|---|---|---|---|---|')
const ratios = { lru: [] as number[], sleep: [] as number[], bound: [] as number[] }
let costFailed = 0
let worseThanSleep = 0
let p99Bound = 0
let p50Bound = 0
for (const s of summary) {
  const [c, l, ls, b] = (['cost', 'lru', 'lru-sleep', 'clairvoyant'] as const).map((p) => s.by.get(p))
  const rl = p99(c) / p99(l)
  const rs = p99(c) / p99(ls)
  const rb = p99(c) / p99(b)
  ratios.lru.push(rl)
  ratios.sleep.push(rs)
  ratios.bound.push(rb)
  costFailed += c?.failed ?? 0
  if (rs > 1) worseThanSleep++
  if (rb > 1.5) p99Bound++
  if (p50(c) - p50(b) > 1) p50Bound++
  console.log(
    `| ${s.trace} | ${f(p99(c))} | ${f(p99(l))} | ${f(p99(ls))} | ${f(p99(b))} | ${f(rl)} | ${f(rs)} | ${f(rb)} | ` +
      `${f(p50(c))} | ${f(p50(b))} | ${c?.failed ?? '—'} / ${l?.failed ?? '—'} / ${ls?.failed ?? '—'} |`,
  )
}
const ok = (b: boolean) => (b ? 'ok' : 'MISSED')
console.log(
  `\nmedian over ${summary.length} traces: cost/lru ${f(median(ratios.lru))} (goal ≤ 0.5: ${ok(median(ratios.lru) <= 0.5)}), ` +
    `cost/lru-sleep ${f(median(ratios.sleep))} (≤ 0.8: ${ok(median(ratios.sleep) <= 0.8)}), ` +
    `cost/bound ${f(median(ratios.bound))}`,
)
console.log(
  `goals on every trace: cost failed ${costFailed} (0: ${ok(costFailed === 0)}); worse than lru-sleep on ${worseThanSleep} ` +
    `(${ok(worseThanSleep === 0)}); p99 beyond 1.5 × the bound on ${p99Bound} (${ok(p99Bound === 0)}); ` +
    `p50 more than 1 s above the bound's on ${p50Bound} (${ok(p50Bound === 0)})`,
)
console.error(`(replayed in ${((performance.now() - wall0) / 1000).toFixed(1)} s of wall time)`)

if (LIVE) {
  if (SCALE < 0.2)
    throw new Error(
      '--live runs at --scale 0.2 or more (below it the machine, not the policy, sets the figures)',
    )
  const shapeName = SHAPES[0]!
  const shape = SHAPE[shapeName]!
  const seed = SEEDS[0]!
  const opts = { ...shape.trace, ...over, seed, models: shape.models.map((m) => m.name) }
  const trace = generateTrace(opts)
  console.log(`\n### live: ${shapeName} seed ${seed}, real gateway and simulator, time × ${SCALE}`)
  const live: LiveOutcome[] = []
  for (const policy of POLICIES.filter((p) => p !== 'clairvoyant') as LivePolicy[]) {
    const r = await runLive(policy, trace, {
      scale: SCALE,
      minutes: opts.minutes,
      models: shape.models,
      preload: 3,
      dump: DUMP,
    })
    live.push(r)
    console.error(`  live ${policy}: done (${r.served} served, ${r.failed} failed)`)
  }
  table(live, ' (live)')
  const replayed = summary.find((s) => s.trace === `${shapeName} seed ${seed}`)
  if (replayed) table([...replayed.by.values()], ' (replay)')
}
