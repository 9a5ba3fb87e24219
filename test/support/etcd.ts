import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { connect, createServer, type Server, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { abortable } from '../../src/host/abortable.ts'
import { freePort } from '../sim/helpers.ts'
import { waitFor } from './wait.ts'

/**
 * Test support for a real etcd (Debian's `etcd-server`): one single-member etcd per call on free
 * loopback ports with its own temp data dir, a TCP proxy to cut one client off from it (a network
 * partition of a single pod), and etcdctl for the test's own view of etcd.
 */
export const ETCD_BIN = process.env.ETCD_BIN ?? '/usr/bin/etcd'
export const ETCDCTL_BIN = process.env.ETCDCTL_BIN ?? '/usr/bin/etcdctl'

/** The parts of etcd the tests use, each with the Debian package that installs it (.ci/run does). */
const ETCD_PARTS = {
  etcd: { bin: ETCD_BIN, pkg: 'etcd-server' },
  etcdctl: { bin: ETCDCTL_BIN, pkg: 'etcd-client' },
} as const

/**
 * etcdAvailable tells whether the parts of etcd a test file uses are installed: the etcd server
 * always, etcdctl when the test reads etcd through it (`{ etcdctl: true }`). Without one the test
 * skips, saying exactly which part and package is missing; with CI set it throws instead: CI
 * installs them, so a missing part is a broken run, not a skip.
 */
export function etcdAvailable(need: { etcdctl?: boolean } = {}): boolean {
  const parts = need.etcdctl ? (['etcd', 'etcdctl'] as const) : (['etcd'] as const)
  const missing = parts.filter((p) => !existsSync(ETCD_PARTS[p].bin))
  if (missing.length === 0) return true
  const what = `${missing.join(' and ')} ${missing.length > 1 ? 'are' : 'is'} missing (${missing
    .map((p) => `${ETCD_PARTS[p].bin}: Debian package "${ETCD_PARTS[p].pkg}"`)
    .join('; ')})`
  if (process.env.CI) throw new Error(`${what}: with CI set, tests that need it fail instead of skipping`)
  console.warn(`${what}; skipping the tests that need it. .ci/run installs it.`)
  return false
}

export interface TestEtcd {
  /** url: the client URL, e.g. http://127.0.0.1:41234 */
  url: string
  port: number
  pid: number
  /** stop ends etcd (TERM, then KILL after 5 s) and removes its data dir. */
  stop(): Promise<void>
  /** kill ends it at once (KILL) and removes its data dir. */
  kill(): Promise<void>
  /** output: what etcd printed so far (its stderr), for a failure message. */
  output(): string
}

const live = new Set<TestEtcd>()
process.on('exit', () => {
  for (const e of live) {
    try {
      process.kill(e.pid, 'SIGKILL')
    } catch {}
  }
})

/** startEtcd spawns etcd and resolves once its /health answers; it tries new ports if the first were taken. */
export async function startEtcd(): Promise<TestEtcd> {
  let last: unknown
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      return await spawnEtcd()
    } catch (err) {
      last = err
    }
  }
  throw last
}

async function spawnEtcd(): Promise<TestEtcd> {
  const [port, peerPort] = [await freePort(), await freePort()]
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-etcd-'))
  const url = `http://127.0.0.1:${port}`
  const peer = `http://127.0.0.1:${peerPort}`
  const proc = Bun.spawn(
    [
      ETCD_BIN,
      '--name=test',
      `--data-dir=${join(dir, 'data')}`,
      `--listen-client-urls=${url}`,
      `--advertise-client-urls=${url}`,
      `--listen-peer-urls=${peer}`,
      `--initial-advertise-peer-urls=${peer}`,
      `--initial-cluster=test=${peer}`,
      '--logger=zap',
      '--log-level=warn',
    ],
    { stdin: 'ignore', stdout: 'ignore', stderr: 'pipe' },
  )
  let stderr = ''
  void (async () => {
    const decoder = new TextDecoder()
    for await (const chunk of proc.stderr)
      stderr = (stderr + decoder.decode(chunk, { stream: true })).slice(-8000)
  })()
  let exited = false
  void proc.exited.then(() => {
    exited = true
  })
  const remove = () => rmSync(dir, { recursive: true, force: true })
  const end = async (signal: 'SIGTERM' | 'SIGKILL') => {
    if (!exited) proc.kill(signal)
    await abortable(proc.exited, { timeoutMs: 5000, what: 'etcd to exit' }).catch(() => {
      proc.kill('SIGKILL')
      return proc.exited
    })
    live.delete(etcd)
    remove()
  }
  const etcd: TestEtcd = {
    url,
    port,
    pid: proc.pid,
    stop: () => end('SIGTERM'),
    kill: () => end('SIGKILL'),
    output: () => stderr,
  }
  live.add(etcd)
  try {
    await waitFor(
      `etcd at ${url} to report healthy`,
      async () => {
        if (exited) throw new Error(`etcd exited before it was healthy: ${stderr.slice(-2000)}`)
        const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(1000) }).catch(() => undefined)
        return res?.ok && ((await res.json()) as { health?: string }).health === 'true'
      },
      { timeoutMs: 20_000, pollMs: 50 },
    )
  } catch (err) {
    await end('SIGKILL')
    throw err
  }
  return etcd
}

/** etcdctl runs etcdctl (API v3) against `url` and answers its stdout; a non-zero exit throws with its stderr. */
export async function etcdctl(url: string, ...args: string[]): Promise<string> {
  const proc = Bun.spawn([ETCDCTL_BIN, `--endpoints=${url}`, ...args], {
    env: { ...process.env, ETCDCTL_API: '3' },
    stdin: 'ignore',
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const [out, err, code] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ])
  if (code !== 0) throw new Error(`etcdctl ${args.join(' ')} exited ${code}: ${err.trim()}`)
  return out
}

/** EtcdKey: a key as `etcdctl get -w json` shows it, decoded. */
export interface EtcdKey {
  key: string
  value: string
  createRevision: number
}

/** etcdKeys lists every key under `prefix` through etcdctl (the test's view, independent of the code under test). */
export async function etcdKeys(url: string, prefix: string): Promise<{ revision: number; keys: EtcdKey[] }> {
  const out = JSON.parse(await etcdctl(url, 'get', '--prefix', prefix, '-w', 'json')) as {
    header: { revision: number }
    kvs?: { key: string; value?: string; create_revision: number }[]
  }
  const dec = (s: string | undefined) => (s ? Buffer.from(s, 'base64').toString('utf8') : '')
  return {
    revision: out.header.revision,
    keys: (out.kvs ?? []).map((kv) => ({
      key: dec(kv.key),
      value: dec(kv.value),
      createRevision: kv.create_revision,
    })),
  }
}

/**
 * TcpProxy forwards a loopback port to `targetPort`. `cut()` closes the listener and every
 * connection through it (the client sees refused connections: a partition); `heal()` listens again
 * on the same port.
 */
export interface TcpProxy {
  url: string
  port: number
  cut(): Promise<void>
  heal(): Promise<void>
  close(): Promise<void>
}

export async function startTcpProxy(targetPort: number): Promise<TcpProxy> {
  const port = await freePort()
  const sockets = new Set<Socket>()
  let server: Server | undefined
  const listen = async () => {
    const s = createServer((client) => {
      const upstream = connect(targetPort, '127.0.0.1')
      for (const sock of [client, upstream]) {
        sockets.add(sock)
        sock.on('error', () => {})
        sock.on('close', () => {
          sockets.delete(sock)
          client.destroy()
          upstream.destroy()
        })
      }
      client.pipe(upstream)
      upstream.pipe(client)
    })
    const ready = Promise.withResolvers<void>()
    s.once('error', ready.reject)
    s.listen(port, '127.0.0.1', () => ready.resolve())
    await ready.promise
    server = s
  }
  const cut = async () => {
    const s = server
    server = undefined
    for (const sock of sockets) sock.destroy()
    sockets.clear()
    if (s) await new Promise<void>((resolve) => s.close(() => resolve()))
  }
  await listen()
  return { url: `http://127.0.0.1:${port}`, port, cut, heal: listen, close: cut }
}
