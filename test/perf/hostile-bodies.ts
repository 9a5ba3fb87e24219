/**
 * hostile-bodies measures what hostile request bodies cost a listener: the RSS of a modelgate
 * process and how long `/api/health` takes to answer, first with no load (the baseline, in the same
 * run), then while rounds of bodies arrive at once.
 *
 * - proxy: the gateway's inference proxy with an inference key (test/perf/proxy-server.ts), rounds of
 *   four 20 MB bodies of nested arrays: without the key (refused from the head), and with it (read,
 *   then refused as too deep by the scan).
 * - internal: a cluster pod (`modelgate serve`, gateway + cluster, `static` coordination listing
 *   pod b, this one, and pod a at 127.0.0.1), rounds of eight 120 MB inference hops
 *   (`/internal/v1/…`) with a fake signature and a fresh timestamp, addressed to b: naming an
 *   unknown pod, naming pod a from 127.0.0.2 (not its address), and naming pod a from its own
 *   address (the head cannot tell those from a's: read, hashed, refused 401).
 *
 *   bun test/perf/hostile-bodies.ts [--rounds 5] [--case proxy|internal] [--server path/to/proxy-server.ts]
 *
 * `--server` runs another checkout's proxy-server.ts (e.g. a worktree of an older commit) to print
 * its figures the same way; for the internal case, run this file from that checkout (the pod is its
 * src/main.ts).
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { freePort } from '../sim/helpers.ts'
import { PodProcess } from '../support/pods.ts'
import { rssMb, spawnJson } from './procs.ts'

/** ServerLine: what the stub and the proxy server print once listening. */
type ServerLine = { url?: string; port?: number; pid: number }

const HERE = import.meta.dir
const BUN = process.execPath
const KEY = 'hostile-bodies-key'
const CLUSTER_SECRET = 'hostile-bodies-cluster-secret-0123'
const args = process.argv.slice(2)
const arg = (name: string, fallback: string) => {
  const i = args.indexOf(name)
  return i >= 0 ? args[i + 1]! : fallback
}
const ROUNDS = Number(arg('--rounds', '5'))
const SERVER = arg('--server', join(HERE, 'proxy-server.ts'))
const CASE = arg('--case', 'all')
const children: Subprocess[] = []
const cleanups: (() => Promise<void>)[] = []

/**
 * send: one request of `body` (head then body, as fast as the socket takes it), from `localAddress`
 * when given; resolves with the status.
 */
function send(port: number, head: string, body: Buffer, localAddress?: string): Promise<number> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port, ...(localAddress ? { localAddress } : {}) }, () => {
      s.write(head)
      s.write(body)
    })
    let got = ''
    s.on('data', (d) => {
      got += d.toString('latin1')
    })
    s.on('error', () => {})
    s.on('close', () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(got)?.[1] ?? 0)))
  })
}

async function healthMs(url: string): Promise<number> {
  const t = performance.now()
  const res = await fetch(`${url}/api/health`)
  await res.arrayBuffer()
  return performance.now() - t
}

const pct = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))]!

/** Attack: one round's requests, sent at once; resolves with their statuses. */
type Attack = () => Promise<number[]>

/**
 * measure: the table for one listener: its baseline (health probed with nothing else going on),
 * then per attack ROUNDS rounds while health is probed in a loop, with the peak RSS seen.
 */
async function measure(url: string, pid: number, attacks: [string, Attack][]): Promise<string[]> {
  for (let i = 0; i < 20; i++) await healthMs(url)
  const idle: number[] = []
  for (let i = 0; i < 50; i++) idle.push(await healthMs(url))
  const rows = [
    `| none (baseline) | — | ${rssMb(pid).toFixed(0)} | ${pct(idle, 0.5).toFixed(1)} / ${Math.max(...idle).toFixed(1)} (${idle.length} probes) |`,
  ]
  for (const [name, attack] of attacks) {
    let peak = rssMb(pid)
    const during: number[] = []
    const statuses = new Map<number, number>()
    for (let r = 0; r < ROUNDS; r++) {
      let done = false
      const round = attack().then((ss) => {
        done = true
        for (const s of ss) statuses.set(s, (statuses.get(s) ?? 0) + 1)
      })
      while (!done) {
        during.push(await healthMs(url))
        peak = Math.max(peak, rssMb(pid))
      }
      await round
    }
    rows.push(
      `| ${name} | ${[...statuses].map(([s, n]) => `${n}× ${s}`).join(', ')} | ${peak.toFixed(0)} | ` +
        `${pct(during, 0.5).toFixed(1)} / ${Math.max(...during).toFixed(1)} (${during.length} probes) |`,
    )
  }
  return rows
}

function print(title: string, rows: string[]): void {
  console.log(`\n${title}`)
  console.log('| bodies | answers | peak RSS MB | /api/health ms p50 / max |')
  console.log('|---|---|---|---|')
  for (const r of rows) console.log(r)
}

async function proxyCase(): Promise<void> {
  const stub = await spawnJson<ServerLine>([BUN, join(HERE, 'proxy-stub.ts')], children)
  const mg = await spawnJson<ServerLine>(
    [BUN, SERVER, '--upstream', String(stub.info.port!), '--api-key', KEY],
    children,
  )
  const url = mg.info.url!
  const port = Number(new URL(url).port)
  const body = Buffer.alloc(20_000_000, 0x5b)
  body.write('{"model":"bench-model","messages":', 0)
  const head = (auth: string) =>
    `POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Type: application/json\r\n${auth}Content-Length: ${body.length}\r\n\r\n`
  const four = (auth: string) => () => Promise.all([0, 1, 2, 3].map(() => send(port, head(auth), body)))
  const rows = await measure(url, mg.info.pid, [
    ['without the key', four('')],
    ['with the key', four(`Authorization: Bearer ${KEY}\r\n`)],
  ])
  print(`hostile bodies: ${ROUNDS} rounds of 4 × 20 MB nested arrays at once, server ${SERVER}`, rows)
}

/** The internal case's requests: a hop of `length` bytes to pod b with a fake signature, naming `claims`. */
function internalHead(claims: string, length: number): string {
  // A well-formed signature (64 hex digits) that is not the HMAC: only verifying the body tells.
  return (
    `POST /internal/v1/v1/chat/completions?hop=x.1&to=b HTTP/1.1\r\nHost: b\r\nConnection: close\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${length}\r\nX-Cluster-Signature: ${'ab'.repeat(32)}\r\n` +
    `X-Cluster-Timestamp: ${Date.now()}\r\nX-Cluster-Pod: ${claims}\r\nX-Cluster-Term: 1\r\n\r\n`
  )
}

const FLOOD_BYTES = 120_000_000
const FLOOD_COUNT = 8

/**
 * flood (the `--flood` child): FLOOD_COUNT hops of FLOOD_BYTES at once to `port`, naming `claims`,
 * from `from` ('-': the default address); prints their statuses as one JSON line. A process of its
 * own: writing 960 MB a round would otherwise slow the health probes' own event loop, not the pod's.
 */
async function flood(port: number, claims: string, from: string): Promise<void> {
  const body = Buffer.alloc(FLOOD_BYTES, 0x20)
  const local = from === '-' ? undefined : from
  const statuses = await Promise.all(
    Array.from({ length: FLOOD_COUNT }, () => send(port, internalHead(claims, body.length), body, local)),
  )
  process.stdout.write(`${JSON.stringify(statuses)}\n`)
}

async function internalCase(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hostile-internal-'))
  const [port, peerPort] = [await freePort(), await freePort()]
  const pod = await PodProcess.start({
    dir,
    id: 'b',
    port,
    enginePorts: [27260, 27269],
    logLevel: 'error',
    env: { CLUSTER_SECRET },
    cluster: [
      '    pod_id: b',
      `    advertise_address: http://127.0.0.1:${port}`,
      '    coordination:',
      '      kind: static',
      `      static: { leader: b, peers: [{ pod_id: a, address: 'http://127.0.0.1:${peerPort}' }] }`,
    ].join('\n'),
  })
  cleanups.push(async () => {
    await pod.stop()
    rmSync(dir, { recursive: true, force: true })
  })
  const round =
    (claims: string, from = '-') =>
    async () => {
      const p = Bun.spawn([BUN, import.meta.path, '--flood', String(port), claims, from], {
        stdout: 'pipe',
        stderr: 'inherit',
        stdin: 'ignore',
      })
      children.push(p)
      const out = await new Response(p.stdout).text()
      await p.exited
      return JSON.parse(out) as number[]
    }
  const rows = await measure(pod.url, pod.pid, [
    ['unknown pod', round('mallory')],
    ["pod a's id from 127.0.0.2", round('a', '127.0.0.2')],
    ["pod a's id from its address", round('a')],
  ])
  print(
    `internal flood: ${ROUNDS} rounds of ${FLOOD_COUNT} × ${FLOOD_BYTES / 1e6} MB hops with a fake signature at once, pod ${join(HERE, '../..')}`,
    rows,
  )
}

try {
  const f = args.indexOf('--flood')
  if (f >= 0) await flood(Number(args[f + 1]), args[f + 2]!, args[f + 3]!)
  else {
    if (CASE === 'all' || CASE === 'proxy') await proxyCase()
    if (CASE === 'all' || CASE === 'internal') await internalCase()
  }
} finally {
  for (const c of children) c.kill('SIGTERM')
  for (const c of cleanups) await c()
}
