/**
 * Paired CPU (`npm run bench:paired`): what one request costs this tree's proxy against another
 * tree's, with both loaded at the same time. bench:proxy measures its targets one after another, so
 * a shared machine's drift between two measurements lands in their ratio (its untraced ratios of one
 * and the same tree move by about ±0.1 between runs). Here the two servers (the same server script of
 * each tree, on one stub) take the same load at the same moment, each from its own load generator
 * at `--concurrency` (16), for `--rounds` rounds of `--seconds`; what the machine does to one it
 * does to the other, and the per-round ratio of their CPU per request (user + system, /proc) is
 * what is left. A tree against itself (`--baseline .`) shows the method's own spread.
 *
 *   bun test/perf/paired.ts --baseline DIR [--server proxy-server.ts|router-server.ts]
 *     [--rounds 8] [--seconds 4] [--concurrency 16] [--trace] [--tree DIR]
 *
 * `--tree DIR`: the tree measured against the baseline is DIR's instead of this one (two commits
 * other than this one, e.g. a change alone against the commit before it, in worktrees).
 *
 * `--trace`: this tree's server traces every request (`--sample-ratio R`: that share), exporting to
 * a local collector (otlp-sink.ts); then DIR may be `.` to read tracing's own cost. `--trace-both`:
 * the baseline's too (a change to tracing itself, against the tree before it).
 */
import { join, resolve } from 'node:path'
import type { Subprocess } from 'bun'
import { numberArg } from './args.ts'
import { cpuMs, proxyLoad, spawnJson, stopAll } from './procs.ts'

const HERE = import.meta.dir
const BUN = process.execPath
const argOf = (name: string) => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1] : undefined
}
const BASELINE = argOf('--baseline')
const SERVER = argOf('--server') ?? 'proxy-server.ts'
const TREE = argOf('--tree')
const MINE = TREE ? join(resolve(TREE), 'test/perf') : HERE
const ROUNDS = Math.max(1, numberArg('--rounds', 8))
const SECONDS = numberArg('--seconds', 4)
const CONCURRENCY = numberArg('--concurrency', 16)
const TRACE_BOTH = process.argv.includes('--trace-both')
const TRACE = TRACE_BOTH || process.argv.includes('--trace')
const SAMPLE_RATIO = numberArg('--sample-ratio', 1)
if (!BASELINE || !['proxy-server.ts', 'router-server.ts'].includes(SERVER)) {
  console.error('usage: paired.ts --baseline DIR [--server proxy-server.ts|router-server.ts] [--rounds N]')
  process.exit(2)
}

const children: Subprocess[] = []
type Line = { url?: string; port?: number; pid: number }
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/** load: one load generator (proxy-load.ts) on `url` for SECONDS, in a process of its own. */
const load = (url: string) => proxyLoad(url, CONCURRENCY, SECONDS * 1000)

async function main(): Promise<void> {
  const stub = await spawnJson<Line>([BUN, join(HERE, 'proxy-stub.ts')], children)
  const upstream = ['--upstream', String(stub.info.port)]
  const sink = TRACE ? await spawnJson<Line>([BUN, join(HERE, 'otlp-sink.ts')], children) : null
  const traced = sink ? ['--trace', sink.info.url!, '--sample-ratio', String(SAMPLE_RATIO)] : []
  const base = await spawnJson<Line>(
    [BUN, join(resolve(BASELINE!), 'test/perf', SERVER), ...upstream, ...(TRACE_BOTH ? traced : [])],
    children,
  )
  const mine = await spawnJson<Line>([BUN, join(MINE, SERVER), ...upstream, ...traced], children)
  const path = '/v1/chat/completions'
  const servers = [base, mine]
  await Promise.all(servers.map((s) => load(`${s.info.url}${path}`))) // warm-up: JIT, connections
  const cpu: number[][] = [[], []]
  const p50: number[][] = [[], []]
  const ratios: number[] = []
  let errors = 0
  for (let r = 0; r < ROUNDS; r++) {
    const before = servers.map((s) => cpuMs(s.info.pid))
    const runs = await Promise.all(servers.map((s) => load(`${s.info.url}${path}`)))
    const perReq = servers.map((s, i) => ((cpuMs(s.info.pid) - before[i]!) * 1000) / runs[i]!.requests)
    for (let i = 0; i < 2; i++) {
      cpu[i]!.push(perReq[i]!)
      p50[i]!.push(runs[i]!.p50_us)
      errors += runs[i]!.errors
    }
    ratios.push(perReq[1]! / perReq[0]!)
    process.stderr.write('.')
  }
  process.stderr.write('\n')
  const label = `${SERVER}${TRACE ? `, ${TRACE_BOTH ? 'both' : 'this tree'} traced (sample_ratio ${SAMPLE_RATIO})` : ''}`
  console.log(
    `\npaired CPU per request (${label}; ${ROUNDS} rounds of ${SECONDS} s, c=${CONCURRENCY} each, both at once; ${navigator.hardwareConcurrency} CPUs)\n`,
  )
  console.log(
    `  baseline ${BASELINE}: CPU µs/request ${median(cpu[0]!).toFixed(1)}, p50 ${median(p50[0]!).toFixed(0)} µs`,
  )
  const mineName = TREE ?? 'this tree'
  console.log(
    `  ${mineName}:${' '.repeat(Math.max(1, BASELINE!.length - mineName.length + 9))}CPU µs/request ${median(cpu[1]!).toFixed(1)}, p50 ${median(p50[1]!).toFixed(0)} µs`,
  )
  const spread = `[${Math.min(...ratios).toFixed(3)}–${Math.max(...ratios).toFixed(3)}]`
  console.log(
    `  CPU per request, this/baseline: ${median(ratios).toFixed(3)} ${spread}  each round [${ratios.map((x) => x.toFixed(3)).join(' ')}]`,
  )
  console.log(`  errors: ${errors}`)
}

try {
  await main()
} finally {
  await stopAll(children)
}
