/**
 * bench:cluster, first half: the latency the one-hop `/v1` path adds against the local path, in the
 * same run. Two pods, each a `modelgate serve` process of its own (gateway + cluster, `static`
 * coordination, pod a leading), on simulated GPUs with the vLLM simulator as the engine, told to
 * answer at once (SIM_TTFT_MS 0, one token). The model is loaded on pod b only, so the two paths
 * share the engine, the body and the client:
 *
 * - local: client → pod b's `/v1` → b's engine;
 * - one hop: client → pod a's `/v1` → b's gateway (`/internal/v1/…`, signed, verified) → b's engine.
 *
 * The load runs in a process of its own (this file with `--load`): C keep-alive connections, each
 * sending the same non-streamed chat back to back for `--duration-ms`. Every concurrency runs in
 * ROUNDS rounds with the two paths in alternating order; the table shows medians over rounds, and
 * the added latency is the median of the per-round differences (hop − local), each round printed
 * beside it. The second half of bench:cluster (failover time over leader kills) is cluster-failover.ts.
 *
 *   bun test/perf/cluster-hop.ts [--rounds 5] [--duration-ms 3000] [--quick]
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from '../sim/helpers.ts'
import { PodProcess } from '../support/pods.ts'
import { waitFor } from '../support/wait.ts'
import { numberArg } from './args.ts'

const BUN = process.execPath
const QUICK = process.argv.includes('--quick')
const ROUNDS = Math.max(1, numberArg('--rounds', QUICK ? 1 : 5) || 1)
const DURATION_MS = numberArg('--duration-ms', QUICK ? 1500 : 3000)
const CONCURRENCY = [1, 32]
const MODEL = 'bench-model'
const SECRET = 'bench-cluster-secret-0123456789'
const BODY = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 })

interface Load {
  requests: number
  errors: number
  rps: number
  p50_us: number
  p99_us: number
}

/** load: the `--load` child: C connections posting BODY back to back; one JSON line on stdout. */
async function load(url: string, concurrency: number, durationMs: number): Promise<void> {
  const latencies: number[] = []
  let errors = 0
  const end = performance.now() + durationMs
  const worker = async () => {
    while (performance.now() < end) {
      const t = performance.now()
      try {
        const res = await fetch(url, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: BODY,
        })
        await res.arrayBuffer()
        if (res.status === 200) latencies.push(performance.now() - t)
        else errors++
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
    latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))]
  const result: Load = {
    requests: latencies.length,
    errors,
    rps: (latencies.length / wall) * 1000,
    p50_us: (pct(50) ?? Number.NaN) * 1000,
    p99_us: (pct(99) ?? Number.NaN) * 1000,
  }
  process.stdout.write(`${JSON.stringify(result)}\n`)
}

function arg(name: string): string {
  const i = process.argv.indexOf(name)
  if (i < 0) throw new Error(`missing ${name}`)
  return process.argv[i + 1]!
}

/** startPod: one `modelgate serve` process (test/support/pods.ts), `static` coordination, pod a leading. */
function startPod(
  dir: string,
  id: string,
  ports: Record<string, number>,
  engines: number,
): Promise<PodProcess> {
  const peers = Object.entries(ports)
    .map(([pod, p]) => `{ pod_id: ${pod}, address: 'http://127.0.0.1:${p}' }`)
    .join(', ')
  return PodProcess.start({
    dir,
    id,
    port: ports[id]!,
    enginePorts: [engines, engines + 9],
    gpus: '1x80',
    logLevel: 'warn',
    env: { CLUSTER_SECRET: SECRET },
    simEnv: { SIM_LOAD_DELAY_MS: '200', SIM_TOKENS_PER_SEC: '100000', SIM_TTFT_MS: '0' },
    cluster: [
      `    pod_id: ${id}`,
      `    advertise_address: http://127.0.0.1:${ports[id]}`,
      `    expected_size: 2`,
      `    coordination:`,
      `      kind: static`,
      `      static: { leader: a, peers: [${peers}] }`,
    ].join('\n'),
  })
}

async function runLoad(url: string, concurrency: number, durationMs: number): Promise<Load> {
  const p = Bun.spawn(
    [
      BUN,
      import.meta.path,
      '--load',
      '--url',
      url,
      '--concurrency',
      String(concurrency),
      '--duration-ms',
      String(durationMs),
    ],
    { stdout: 'pipe', stderr: 'inherit' },
  )
  const out = await new Response(p.stdout).text()
  if ((await p.exited) !== 0) throw new Error(`load generator failed on ${url}`)
  return JSON.parse(out) as Load
}

function median(xs: number[]): number {
  const v = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b)
  if (v.length === 0) return Number.NaN
  const mid = v.length >> 1
  return v.length % 2 ? v[mid]! : (v[mid - 1]! + v[mid]!) / 2
}

const fmt = (v: number, digits = 0) => (Number.isFinite(v) ? v.toFixed(digits) : '—')

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-bench-cluster-'))
  const pods: PodProcess[] = []
  try {
    const ports = { a: await freePort(), b: await freePort() }
    pods.push(await startPod(dir, 'a', ports, 28400), await startPod(dir, 'b', ports, 28410))
    const [a, b] = pods as [PodProcess, PodProcess]
    const loaded = await fetch(`${b.url}/api/v1/models/load`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model_path: 'bench/hop-model',
        served_model_name: MODEL,
        gpu_memory_utilization: 0.5,
      }),
    })
    if (loaded.status !== 202) throw new Error(`load on pod b: ${loaded.status} ${await loaded.text()}`)
    const { instance_id } = (await loaded.json()) as { instance_id: string }
    await waitFor(
      `${MODEL} active on pod b`,
      async () => {
        const r = (await (await fetch(`${b.url}/api/v1/models/${instance_id}`)).json()) as {
          model?: { status: string }
        }
        return r.model?.status === 'active'
      },
      { timeoutMs: 30_000, pollMs: 50 },
    )
    await waitFor(
      `pod a's routing table to list ${MODEL}`,
      async () => {
        const t = (await (await fetch(`${a.url}/api/cluster/routing-table`)).json()) as {
          entries: Record<string, unknown[]>
        }
        return (t.entries[MODEL]?.length ?? 0) > 0
      },
      { timeoutMs: 30_000, pollMs: 50 },
    )
    const paths = [
      { name: 'local (pod b /v1)', url: `${b.url}/v1/chat/completions` },
      { name: 'one hop (a → b)', url: `${a.url}/v1/chat/completions` },
    ]
    // Warm both paths (JIT, pooled connections), unmeasured.
    for (const p of paths) await runLoad(p.url, 32, 1000)
    const results = new Map<string, Load[]>()
    for (const c of CONCURRENCY)
      for (let round = 0; round < ROUNDS; round++) {
        const order = round % 2 === 0 ? paths : [...paths].reverse()
        for (const p of order) {
          const key = `${p.name}|${c}`
          results.set(key, [...(results.get(key) ?? []), await runLoad(p.url, c, DURATION_MS)])
        }
      }
    report(paths, results)
  } finally {
    await Promise.all(pods.map((p) => p.stop()))
    rmSync(dir, { recursive: true, force: true })
  }
}

function report(paths: { name: string }[], results: Map<string, Load[]>): void {
  const [local, hop] = paths.map((p) => p.name) as [string, string]
  const at = (name: string, c: number) => results.get(`${name}|${c}`)!
  const rows: string[][] = [['metric', local, hop, 'added (hop − local)', 'added per round']]
  for (const c of CONCURRENCY) {
    for (const [label, key] of [
      ['p50 µs', 'p50_us'],
      ['p99 µs', 'p99_us'],
    ] as const) {
      const added = at(hop, c).map((h, i) => h[key] - at(local, c)[i]![key])
      rows.push([
        `${label} c=${c}`,
        fmt(median(at(local, c).map((r) => r[key]))),
        fmt(median(at(hop, c).map((r) => r[key]))),
        fmt(median(added)),
        ROUNDS > 1 ? `[${added.map((v) => fmt(v)).join(' ')}]` : '',
      ])
    }
    rows.push([
      `req/s c=${c}`,
      fmt(median(at(local, c).map((r) => r.rps))),
      fmt(median(at(hop, c).map((r) => r.rps))),
      '',
      '',
    ])
    const errors = (name: string) => at(name, c).reduce((n, r) => n + r.errors, 0)
    rows.push([`errors c=${c}`, String(errors(local)), String(errors(hop)), '', ''])
  }
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)))
  const line = (r: string[]) =>
    r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  console.log(
    `\ncluster hop benchmark (${ROUNDS} round(s) of ${DURATION_MS} ms, medians; ${navigator.hardwareConcurrency} CPUs)\n`,
  )
  console.log(line(rows[0]!))
  console.log(widths.map((w) => '-'.repeat(w)).join('  '))
  for (const r of rows.slice(1)) console.log(line(r))
}

if (process.argv.includes('--load'))
  await load(arg('--url'), Number(arg('--concurrency')), Number(arg('--duration-ms')))
else await main()
