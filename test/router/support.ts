import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { plugins } from '../../plugins/index.ts'
import router, { routerPlugin as routerWithClock } from '../../plugins/router/index.ts'
import type { PluginDefinition } from '../../src/host/plugin.ts'
import { type EngineProc, freePort, spawnEngine, tempSimDir, waitHealthy } from '../sim/helpers.ts'
import { gatewayYaml } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'

/**
 * Test support for the router: simulator engines with sleep mode (each on its own simulated GPUs),
 * a Host running the router alone or beside the gateway, and small HTTP helpers.
 */
export const routerPlugin = router as unknown as PluginDefinition
const withoutRouter = plugins.filter((p) => p.id !== 'router')

export interface SimOptions {
  wakeDelayMs?: number
  tokensPerSec?: number
  servedName?: string
  env?: Record<string, string>
}

/** startSim spawns `sim engine MODEL --enable-sleep-mode` (dev mode on) and waits for /health. */
export async function startSim(model: string, o: SimOptions = {}): Promise<EngineProc> {
  const args = ['--sim-dir', tempSimDir(), '--sim-gpus', '2x80', '--enable-sleep-mode']
  if (o.servedName) args.push('--served-model-name', o.servedName)
  const engine = await spawnEngine(model, args, {
    VLLM_SERVER_DEV_MODE: '1',
    SIM_LOAD_DELAY_MS: '200',
    SIM_TOKENS_PER_SEC: String(o.tokensPerSec ?? 200),
    SIM_WAKE_DELAY_MS: String(o.wakeDelayMs ?? 300),
    ...o.env,
  })
  await waitHealthy(engine, 20_000)
  return engine
}

/** count tells how many times the engine logged a request line for `method path`. */
export function engineHits(engine: EngineProc, method: string, path: string): number {
  const needle = `"${method} ${path}`
  let n = 0
  for (const text of [engine.stdout(), engine.stderr()]) {
    let i = text.indexOf(needle)
    while (i >= 0) {
      n++
      i = text.indexOf(needle, i + needle.length)
    }
  }
  return n
}

/**
 * TestClock is the router's clock in tests: real time plus however far the test has moved it
 * forward, so statistics windows, idle and sleep times pass without waiting while deadlines and
 * engine calls still run on real time.
 */
export class TestClock {
  private offset = 0
  readonly now = (): number => Date.now() + this.offset
  advance(ms: number): void {
    this.offset += ms
  }
}

/** clocked: a router plugin definition that reads `clock`. */
const clocked = (clock: TestClock) => routerWithClock({ now: clock.now }) as unknown as PluginDefinition

export interface TestRouter extends TestHost {
  /** routerUrl: the router listener's base URL. */
  routerUrl: string
  /** clock: the router's clock; `advance` moves it forward. */
  clock: TestClock
  get<T = Record<string, unknown>>(path: string): Promise<{ status: number; body: T; headers: Headers }>
  post<T = Record<string, unknown>>(
    path: string,
    body?: unknown,
    headers?: Record<string, string>,
  ): Promise<{ status: number; body: T; headers: Headers }>
  /** main: a JSON request to the host's main listener (the gateway's API), as the router tests drive it. */
  main<T = Record<string, unknown>>(path: string, init?: RequestInit): Promise<{ status: number; body: T }>
}

/** routerYaml: a `plugins.router` section on a free port. */
export function routerYaml(section: string): string {
  const indented = section
    .trim()
    .split('\n')
    .map((l) => `    ${l}`)
    .join('\n')
  return `  router:\n    host: 127.0.0.1\n    port: 0\n${indented}\n`
}

export function modelsYaml(models: { name: string; port: number }[]): string {
  if (models.length === 0) return 'models: []'
  return `models:\n${models.map((m) => `  - { name: '${m.name}', endpoint: { host: 127.0.0.1, port: ${m.port} } }`).join('\n')}`
}

/** startRouter boots a Host with only the router plugin (the spec's standalone controller). */
export async function startRouter(section: string, dataDir?: string): Promise<TestRouter> {
  const yaml = `log: { level: warn }\nshutdown: { timeout_ms: 10000 }\nplugins:\n${routerYaml(section)}`
  const clock = new TestClock()
  return wrap(await startHost(yaml, [clocked(clock)], {}, dataDir), clock)
}

/**
 * startRouterWithGateway boots the gateway (driving simulator engines) and the router together;
 * `hostEnv` is the Host's environment (e.g. INFERENCE_API_KEY).
 */
export async function startRouterWithGateway(
  ports: [number, number],
  section: string,
  hostEnv: Record<string, string> = {},
  /** gatewayExtra: more of the gateway plugin's section (4-space indented lines: a catalogue). */
  gatewayExtra = '',
): Promise<TestRouter & { simDir: string }> {
  const simDir = mkdtempSync(join(tmpdir(), 'modelgate-router-gw-'))
  const yaml = gatewayYaml({ ports, extraYaml: gatewayExtra + routerYaml(section) }, simDir).replace(
    'log: { level: debug }',
    'log: { level: warn }',
  )
  const clock = new TestClock()
  const th = await startHost(yaml, [...withoutRouter, clocked(clock)], hostEnv)
  const r = wrap(th, clock)
  return {
    ...r,
    simDir,
    async stop() {
      await r.stop()
      rmSync(simDir, { recursive: true, force: true })
    },
  }
}

function wrap(th: TestHost, clock: TestClock): TestRouter {
  const routerUrl = th.host.urls.router!
  const call = async <T>(path: string, init?: RequestInit) => {
    const res = await fetch(`${routerUrl}${path}`, { ...init, signal: AbortSignal.timeout(20_000) })
    const text = await res.text()
    return { status: res.status, body: (text ? JSON.parse(text) : null) as T, headers: res.headers }
  }
  return {
    ...th,
    routerUrl,
    clock,
    async main<T>(path: string, init?: RequestInit) {
      const res = await fetch(`${th.url}${path}`, {
        ...init,
        headers: { 'content-type': 'application/json' },
        signal: AbortSignal.timeout(20_000),
      })
      return { status: res.status, body: (await res.json()) as T }
    },
    get: (path) => call(path),
    post: (path, body, headers = {}) =>
      call(path, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
      }),
  }
}

export const chat = (model: string, extra: Record<string, unknown> = {}) => ({
  model,
  messages: [{ role: 'user', content: 'Say hello' }],
  max_tokens: 4,
  ...extra,
})

/** Names of the standalone-router fixture: two simulator engines and one endpoint where nothing listens. */
export const TWO_AND_GHOST = { A: 'org/model-a', B: 'model-b', GHOST: 'ghost' } as const

/**
 * startTwoAndGhost boots a router alone in front of two simulator engines (A, B) and a port where
 * nothing listens (GHOST), with short probe deadlines and a 2 s minimum sleep duration.
 */
export async function startTwoAndGhost(a: SimOptions = {}) {
  const { A, B, GHOST } = TWO_AND_GHOST
  const [ea, eb] = await Promise.all([startSim(A, a), startSim(B)])
  // Picked after the engines listen, so the ghost port can never be one an engine was about to take.
  const ghostPort = await freePort()
  const r = await startRouter(`
${modelsYaml([
  { name: A, port: ea.port },
  { name: B, port: eb.port },
  { name: GHOST, port: ghostPort },
])}
auto_sleep: { min_sleep_duration: 2 }
health_timeout_ms: 500
proxy: { connect_timeout_ms: 500 }
`)
  return { a: ea, b: eb, ghostPort, r }
}
