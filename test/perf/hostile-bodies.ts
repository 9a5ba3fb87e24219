/**
 * hostile-bodies measures what hostile request bodies cost a listener: the RSS of a modelgate
 * process (the gateway's inference proxy with an inference key, test/perf/proxy-server.ts) and how
 * long `/api/health` takes to answer, first with no load (the baseline, in the same run), then while
 * rounds of four 20 MB bodies of nested arrays arrive at once: without the key (refused from the
 * head), and with it (read, then refused as too deep by the scan).
 *
 *   bun test/perf/hostile-bodies.ts [--rounds 5] [--server path/to/proxy-server.ts]
 *
 * `--server` runs another checkout's proxy-server.ts (e.g. a worktree of an older commit) to print
 * its figures the same way.
 */
import { readFileSync } from 'node:fs'
import { connect } from 'node:net'
import { join } from 'node:path'
import type { Subprocess } from 'bun'

const HERE = import.meta.dir
const BUN = process.execPath
const KEY = 'hostile-bodies-key'
const args = process.argv.slice(2)
const arg = (name: string, fallback: string) => {
  const i = args.indexOf(name)
  return i >= 0 ? args[i + 1]! : fallback
}
const ROUNDS = Number(arg('--rounds', '5'))
const SERVER = arg('--server', join(HERE, 'proxy-server.ts'))
const children: Subprocess[] = []

function spawnJson(
  argv: string[],
): Promise<{ proc: Subprocess; info: { url?: string; port?: number; pid: number } }> {
  const proc = Bun.spawn(argv, { stdout: 'pipe', stderr: 'inherit', stdin: 'ignore' })
  children.push(proc)
  return (async () => {
    const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader()
    const { value } = await reader.read()
    reader.releaseLock()
    return { proc, info: JSON.parse(new TextDecoder().decode(value).split('\n')[0]!) }
  })()
}

function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return m ? Number(m[1]) / 1024 : Number.NaN
}

/** send: one request of `body` (head then body, as fast as the socket takes it); resolves with the status. */
function send(port: number, head: string, body: Buffer): Promise<number> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port }, () => {
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

async function main(): Promise<void> {
  const stub = await spawnJson([BUN, join(HERE, 'proxy-stub.ts')])
  const stubPort = stub.info.port!
  const mg = await spawnJson([BUN, SERVER, '--upstream', String(stubPort), '--api-key', KEY])
  const url = mg.info.url!
  const port = Number(new URL(url).port)
  const pid = mg.info.pid

  const body = Buffer.alloc(20_000_000, 0x5b)
  body.write('{"model":"bench-model","messages":', 0)
  const head = (auth: string) =>
    `POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Type: application/json\r\n${auth}Content-Length: ${body.length}\r\n\r\n`

  // Baseline: health with nothing else going on.
  for (let i = 0; i < 20; i++) await healthMs(url)
  const idle: number[] = []
  for (let i = 0; i < 50; i++) idle.push(await healthMs(url))
  const idleRss = rssMb(pid)

  const rows: string[] = []
  for (const [name, auth] of [
    ['without the key', ''],
    ['with the key', `Authorization: Bearer ${KEY}\r\n`],
  ] as const) {
    let peak = rssMb(pid)
    const during: number[] = []
    const statuses = new Map<number, number>()
    for (let r = 0; r < ROUNDS; r++) {
      let done = false
      const attack = Promise.all([0, 1, 2, 3].map(() => send(port, head(auth), body))).then((ss) => {
        done = true
        for (const s of ss) statuses.set(s, (statuses.get(s) ?? 0) + 1)
      })
      while (!done) {
        during.push(await healthMs(url))
        peak = Math.max(peak, rssMb(pid))
      }
      await attack
    }
    rows.push(
      `| ${name} | ${[...statuses].map(([s, n]) => `${n}× ${s}`).join(', ')} | ${peak.toFixed(0)} | ` +
        `${pct(during, 0.5).toFixed(1)} / ${Math.max(...during).toFixed(1)} (${during.length} probes) |`,
    )
  }

  console.log(`\nhostile bodies: ${ROUNDS} rounds of 4 × 20 MB nested arrays at once, server ${SERVER}`)
  console.log('| bodies | answers | peak RSS MB | /api/health ms p50 / max |')
  console.log('|---|---|---|---|')
  console.log(
    `| none (baseline) | — | ${idleRss.toFixed(0)} | ${pct(idle, 0.5).toFixed(1)} / ${Math.max(...idle).toFixed(1)} (${idle.length} probes) |`,
  )
  for (const r of rows) console.log(r)
}

try {
  await main()
} finally {
  for (const c of children) c.kill('SIGTERM')
}
