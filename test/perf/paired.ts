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
 *     [--rounds 8] [--seconds 4] [--concurrency 16] [--trace] [--tree DIR] [--path P] [--keys]
 *
 * `--tree DIR`: the tree measured against the baseline is DIR's instead of this one (two commits
 * other than this one, e.g. a change alone against the commit before it, in worktrees).
 *
 * `--path P`: this tree's server is loaded on route P (`/v1/responses`, `/v1/messages`) while the
 * baseline's takes `/v1/chat/completions`; with `--baseline .` that is the route's cost against the
 * chat route's, same tree, same moment (the stub pads its three replies to one length). `--keys`:
 * both servers hold 1,000 inference keys and every request sends one with limits, so each API's
 * usage is read from its answer.
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
const CHAT = '/v1/chat/completions'
const PATH = argOf('--path') ?? CHAT
const KEYS = process.argv.includes('--keys')
if (!BASELINE || !['proxy-server.ts', 'router-server.ts'].includes(SERVER)) {
  console.error('usage: paired.ts --baseline DIR [--server proxy-server.ts|router-server.ts] [--rounds N]')
  process.exit(2)
}

const children: Subprocess[] = []
type Line = { url?: string; port?: number; pid: number }
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/** load: one load generator (proxy-load.ts) on `url` for SECONDS, in a process of its own. */
const load = (url: string, headers: Record<string, string>) =>
  proxyLoad(url, CONCURRENCY, SECONDS * 1000, headers)

async function main(): Promise<void> {
  const padded = PATH === CHAT ? [] : ['--same-length']
  const stub = await spawnJson<Line>([BUN, join(HERE, 'proxy-stub.ts'), ...padded], children)
  const upstream = ['--upstream', String(stub.info.port)]
  // Keyed: each server loads its own copy of 1,000 keys (make-keys.ts), sent the one with limits.
  const keyed = async (): Promise<{ args: string[]; headers: Record<string, string> }> => {
    if (!KEYS) return { args: [], headers: {} }
    const made = await spawnJson<{ dataDir: string; key: string }>(
      [BUN, join(HERE, 'make-keys.ts'), '--keys', '1000'],
      children,
    )
    return { args: ['--data-dir', made.info.dataDir], headers: { authorization: `Bearer ${made.info.key}` } }
  }
  const keysBase = await keyed()
  const keysMine = await keyed()
  const sink = TRACE ? await spawnJson<Line>([BUN, join(HERE, 'otlp-sink.ts')], children) : null
  const traced = sink ? ['--trace', sink.info.url!, '--sample-ratio', String(SAMPLE_RATIO)] : []
  const base = await spawnJson<Line>(
    [
      BUN,
      join(resolve(BASELINE!), 'test/perf', SERVER),
      ...upstream,
      ...keysBase.args,
      ...(TRACE_BOTH ? traced : []),
    ],
    children,
  )
  const mine = await spawnJson<Line>(
    [BUN, join(MINE, SERVER), ...upstream, ...keysMine.args, ...traced],
    children,
  )
  const servers = [base, mine]
  const paths = [CHAT, PATH]
  const headers: Record<string, string>[] = [keysBase.headers, keysMine.headers]
  const loadBoth = () => Promise.all(servers.map((s, i) => load(`${s.info.url}${paths[i]}`, headers[i]!)))
  await loadBoth() // warm-up: JIT, connections
  const cpu: number[][] = [[], []]
  const p50: number[][] = [[], []]
  const ratios: number[] = []
  let errors = 0
  for (let r = 0; r < ROUNDS; r++) {
    const before = servers.map((s) => cpuMs(s.info.pid))
    const runs = await loadBoth()
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
  const label = `${SERVER}${PATH === CHAT ? '' : `, ${PATH} against ${CHAT}`}${KEYS ? ', keyed' : ''}${TRACE ? `, ${TRACE_BOTH ? 'both' : 'this tree'} traced (sample_ratio ${SAMPLE_RATIO})` : ''}`
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
