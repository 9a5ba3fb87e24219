import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { plugins } from '../../plugins/index.ts'
import { groupAlive } from '../sim/helpers.ts'
import { startHost, type TestHost } from './host.ts'
import { waitFor } from './wait.ts'

/**
 * startGateway boots a real Host with the gateway plugin driving real simulator processes
 * (`modelgate sim engine` for vLLM, `sim sglang` for loads with `engine_kind: sglang`, `sim smi`, from
 * source) on simulated GPUs in a temp state dir.
 */
export interface GatewayOptions {
  ports: [number, number]
  gpus?: string
  env?: Record<string, string>
  extraYaml?: string
  simDir?: string
  /** smiSimDir lets nvidia-smi see a different simulated host than the engines (to provoke engine-side failures). */
  smiSimDir?: string
  dataDir?: string
  hostEnv?: Record<string, string>
  stopGraceSeconds?: number
  /** shutdown.drain_ms (default 2000: a test's own stop should not wait long for what it left running). */
  drainMs?: number
  /** self: the argv that runs `sim engine|smi` in the YAML (default `@self`, the host's SELF). */
  self?: readonly string[]
  /** onShutdown: `engine.on_shutdown` (default stop). */
  onShutdown?: 'stop' | 'leave'
  /** liveness: `engine.liveness` (default: the shipped one, a probe every 10 s). */
  liveness?: { interval_ms: number; failures?: number; timeout_ms?: number }
  /** server: the `server:` section beside host 127.0.0.1 and port 0 (e.g. a fixed port a peer must know). */
  server?: Record<string, string | number | Record<string, string>>
  /**
   * shmDir: where the gateway and its simulated engines keep kvcached segments, instead of /dev/shm
   * (MODELGATE_SHM_DIR, for tests and the simulator only; set for this gateway's lifetime).
   */
  shmDir?: string
  /** configFile: the YAML is written to this file in the data dir and read from it (HostOptions.configFile). */
  configFile?: string
}

export interface TestGateway extends TestHost {
  simDir: string
  json<T = Record<string, unknown>>(path: string, init?: RequestInit): Promise<{ status: number; body: T }>
  /** load: POST /api/v1/models/load (202 or it throws); `token`: an admin JWT where auth is on. */
  load(body: Record<string, unknown>, token?: string): Promise<string>
  /** waitStatus: until the instance's record has one of `status` (woken by status events); `token` as load's. */
  waitStatus(
    id: string,
    status: string | string[],
    timeoutMs?: number,
    token?: string,
  ): Promise<Record<string, unknown>>
}

/** bearer: the authorization header of `token`, or none. */
const bearer = (token: string | undefined): Record<string, string> =>
  token ? { authorization: `Bearer ${token}` } : {}

export function gatewayYaml(o: GatewayOptions, simDir: string): string {
  const gpus = o.gpus ?? '2x80'
  const env = { SIM_LOAD_DELAY_MS: '300', SIM_TOKENS_PER_SEC: '200', ...o.env }
  const self = o.self ? o.self.map((a) => `'${a}'`).join(', ') : "'@self'"
  return `
log: { level: debug }
shutdown: { timeout_ms: 15000, drain_ms: ${o.drainMs ?? 2000} }
plugins:
  gateway:
    engine:
      command: [${self}, sim, engine, --sim-dir, '${simDir}', --sim-gpus, '${gpus}']
      commands: { sglang: [${self}, sim, sglang, --sim-dir, '${simDir}', --sim-gpus, '${gpus}'] }
      env: ${JSON.stringify(env)}
      port_range: { start: ${o.ports[0]}, end: ${o.ports[1]} }
      startup_timeout_seconds: 30
      stop_grace_seconds: ${o.stopGraceSeconds ?? 3}
      health_poll_ms: { initial: 50, max: 200 }
      ${o.liveness ? `liveness: ${JSON.stringify(o.liveness)}` : ''}
      ${o.onShutdown ? `on_shutdown: ${o.onShutdown}` : ''}
    gpu:
      smi_command: [${self}, sim, smi, --sim-dir, '${o.smiSimDir ?? simDir}', --sim-gpus, '${gpus}']
      cache_ms: 0
${o.extraYaml ?? ''}`
}

export async function startGateway(o: GatewayOptions): Promise<TestGateway> {
  const simDir = o.simDir ?? mkdtempSync(join(tmpdir(), 'modelgate-gw-sim-'))
  const yaml = gatewayYaml(o, simDir)
  // The gateway reads MODELGATE_SHM_DIR from its environment and its engines inherit it.
  const previousShm = process.env.MODELGATE_SHM_DIR
  const restoreShm = () => {
    if (o.shmDir === undefined) return
    if (previousShm === undefined) delete process.env.MODELGATE_SHM_DIR
    else process.env.MODELGATE_SHM_DIR = previousShm
  }
  if (o.shmDir !== undefined) process.env.MODELGATE_SHM_DIR = o.shmDir
  let th: TestHost
  try {
    th = await startHost(yaml, plugins, o.hostEnv ?? {}, o.dataDir, {
      server: o.server,
      ...(o.configFile ? { configFile: o.configFile } : {}),
    })
  } catch (err) {
    restoreShm()
    throw err
  }
  const json = async <T>(path: string, init?: RequestInit) => {
    const res = await fetch(`${th.url}${path}`, {
      // With server.tls the host's own certificate is trusted (test/host/tls.test.ts makes one).
      ...(th.host.selfCa ? { tls: { ca: th.host.selfCa } } : {}),
      ...init,
      headers: { 'content-type': 'application/json', ...(init?.headers ?? {}) },
    })
    const text = await res.text()
    return { status: res.status, body: (text ? JSON.parse(text) : null) as T }
  }
  const gw: TestGateway = {
    ...th,
    simDir,
    json,
    async load(body, token) {
      const r = await json<{ instance_id: string }>('/api/v1/models/load', {
        method: 'POST',
        body: JSON.stringify(body),
        headers: bearer(token),
      })
      if (r.status !== 202) throw new Error(`load failed: ${r.status} ${JSON.stringify(r.body)}`)
      return r.body.instance_id
    },
    async waitStatus(id, status, timeoutMs = 20000, token) {
      const want = Array.isArray(status) ? status : [status]
      let last: unknown
      return waitFor(
        `instance ${id} to reach ${want.join('|')}`,
        async () => {
          const r = await json<{ model: Record<string, unknown> }>(`/api/v1/models/${id}`, {
            headers: bearer(token),
          })
          last = r.body
          return r.status === 200 && want.includes(r.body.model.status as string) ? r.body.model : undefined
        },
        { timeoutMs, wake: (notify) => th.host.bus.on('gateway.instance.status', notify), show: () => last },
      )
    },
    async stop() {
      try {
        await th.stop()
      } finally {
        restoreShm()
      }
      if (!o.simDir) rmSync(simDir, { recursive: true, force: true })
    },
  }
  return gw
}

/** groupGone tells whether a process group has no process left (`kill(-pgid, 0)` fails). */
export const groupGone = (pgid: number): boolean => !groupAlive(pgid)
