import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { InstanceLifecycleEvent } from '../../plugins/gateway/api.ts'
import { plugins } from '../../plugins/index.ts'
import { readLastLines } from '../../src/engine/log-tail.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { waitFor } from '../support/wait.ts'
import { numberArg } from './args.ts'

/**
 * bench:lifecycle: how much of a load, a sleep, a wake and a held request's first token is
 * modelgate's own time, against the vLLM simulator with known load and wake times. Each figure is
 * printed beside the engine's own time for the same operation, measured in the same run:
 *
 * - load → `active`: engine = spawn → its /health first answers 200 (a probe of the bench's own,
 *   every ~1 ms, on the engine's port); modelgate = spawn → the instance's `active` change
 *   (`gateway.instance.lifecycle`, `at`). Ours = the readiness delay.
 * - sleep → `sleeping`: engine = what it says the sleep took ("It took X seconds to fall asleep");
 *   modelgate = the API call sent → the `sleeping` change.
 * - wake → `running`: engine = "It took X seconds to wake up tags […]"; modelgate = the API call
 *   sent → the `active` change.
 * - held request: the model sleeps, a streamed chat request arrives and is held while the wake runs;
 *   engine = its wake (as above) + its own time to first token on a request sent to it directly
 *   right after (same body); modelgate = request sent → first content chunk received.
 *
 * Ours is taken per repetition (modelgate − engine), then summarised. Everything runs in this one
 * process (the gateway, the router, the probes), on one performance.now() clock; the engines and
 * nvidia-smi are simulator processes. Targets (issue 18): readiness within 100 ms of /health
 * turning 200, at most 50 ms of our own on a wake and on a held request (medians).
 *
 *   npx bun test/perf/lifecycle.ts [--reps 20] [--load-ms 1000] [--wake-ms 300]
 */
const REPS = numberArg('--reps', 20)
const LOAD_MS = numberArg('--load-ms', 1000)
const WAKE_MS = numberArg('--wake-ms', 300)
const MODEL = 'bench/lifecycle-7b'
const CHAT = JSON.stringify({
  model: MODEL,
  messages: [{ role: 'user', content: 'Say hello.' }],
  max_tokens: 4,
  stream: true,
})

interface Row {
  name: string
  engine: number[]
  modelgate: number[]
  ours: number[]
  target?: number
}

const rows: Record<'load' | 'sleep' | 'wake' | 'held' | 'routerHeld', Row> = {
  load: { name: 'load → active', engine: [], modelgate: [], ours: [], target: 100 },
  sleep: { name: 'sleep → sleeping (level 1)', engine: [], modelgate: [], ours: [] },
  wake: { name: 'wake → running (level 1)', engine: [], modelgate: [], ours: [], target: 50 },
  held: { name: 'held request → first token, gateway /v1', engine: [], modelgate: [], ours: [], target: 50 },
  routerHeld: { name: 'held request → first token, router /v1', engine: [], modelgate: [], ours: [] },
}

function record(row: Row, engineMs: number, modelgateMs: number): void {
  row.engine.push(engineMs)
  row.modelgate.push(modelgateMs)
  row.ours.push(modelgateMs - engineMs)
}

/** quantile: linear interpolation between closest ranks (as numpy's default). */
function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b)
  const pos = (s.length - 1) * q
  const lo = Math.floor(pos)
  const hi = Math.ceil(pos)
  return s[lo]! + (s[hi]! - s[lo]!) * (pos - lo)
}

const fmt = (x: number) => x.toFixed(1).padStart(8)
const triple = (xs: number[]) =>
  `${fmt(Math.min(...xs))}${fmt(quantile(xs, 0.5))}${fmt(quantile(xs, 0.95))}  `

async function main(): Promise<void> {
  const simDir = mkdtempSync(join(tmpdir(), 'modelgate-lifecycle-sim-'))
  const env = {
    SIM_LOAD_DELAY_MS: String(LOAD_MS),
    SIM_WAKE_DELAY_MS: String(WAKE_MS),
    SIM_TOKENS_PER_SEC: '200',
  }
  // The gateway with its default readiness polling (engine.health_poll_ms 200 → 2000 ms) and its
  // /v1 holding requests for sleeping models, and the router following it, holding too.
  const yaml = `
log: { level: warn }
shutdown: { timeout_ms: 15000, drain_ms: 1000 }
plugins:
  gateway:
    engine:
      command: ['@self', sim, engine, --sim-dir, '${simDir}', --sim-gpus, '2x80']
      env: ${JSON.stringify(env)}
      port_range: { start: 19600, end: 19699 }
      startup_timeout_seconds: 60
      stop_grace_seconds: 3
    gpu:
      smi_command: ['@self', sim, smi, --sim-dir, '${simDir}', --sim-gpus, '2x80']
    proxy: { wake_on_request: hold, hold_timeout: 60 }
  router:
    host: 127.0.0.1
    port: 0
    from_gateway: true
    wake_on_request: hold
    hold_timeout: 60
`
  const th = await startHost(yaml, plugins, {}, undefined, { logLevel: 'warn' })
  try {
    await run(th)
  } finally {
    await th.stop()
    rmSync(simDir, { recursive: true, force: true })
  }
  print()
}

async function run(th: TestHost): Promise<void> {
  const { bus } = th.host
  const routerUrl = th.host.urls.router!
  /** The latest `at` of each state an instance reached, and when each load was spawned. */
  const reached = new Map<string, number>()
  const spawned = new Map<string, number>()
  bus.on('gateway.instance.status', (e) => {
    if (e.previousStatus === null && e.currentStatus === 'starting')
      spawned.set(e.instance.id, performance.now())
  })
  /** The operation running on each instance (a sleep can only begin once the last wake ended). */
  const operation = new Map<string, string>()
  bus.on('gateway.instance.lifecycle', (e: InstanceLifecycleEvent) => {
    const c = e.change
    if (c.kind === 'state') reached.set(`${e.instance_id}:${c.current}`, e.at)
    if (c.kind === 'operation') {
      if (c.running) operation.set(e.instance_id, c.operation)
      else operation.delete(e.instance_id)
    }
  })
  const api = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${th.url}${path}`, {
      method,
      headers: { 'content-type': 'application/json' },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    const text = await res.text()
    if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${text}`)
    return text ? (JSON.parse(text) as Record<string, unknown>) : {}
  }
  /** idle: no operation runs on the instance (a wake's footprint measurement ends after `active`). */
  const idle = (id: string) =>
    waitFor(`no operation on ${id}`, () => !operation.has(id), {
      timeoutMs: 60_000,
      wake: (notify) => bus.on('gateway.instance.lifecycle', notify),
    })
  const stateAt = (id: string, state: string, what: string) =>
    waitFor(what, () => reached.get(`${id}:${state}`), {
      timeoutMs: 60_000,
      wake: (notify) => bus.on('gateway.instance.lifecycle', notify),
    })

  for (let rep = -1; rep < REPS; rep++) {
    const warm = rep < 0 // one round first, not counted: the first spawn pays for Bun's cold caches
    // load → active
    const load = await api('POST', '/api/v1/models/load', { model_path: MODEL, enable_sleep_mode: true })
    const id = load.instance_id as string
    const port = load.port as number
    const engineUrl = `http://127.0.0.1:${port}`
    const healthyAt = await firstHealthy(engineUrl)
    const activeAt = await stateAt(id, 'active', `instance ${id} active`)
    const spawnAt = spawned.get(id)!
    if (!warm) record(rows.load, healthyAt - spawnAt, activeAt - spawnAt)
    const logFile = join(th.dataDir, 'engines', id, 'stdout.log')

    // sleep → sleeping, wake → running (the API)
    reached.delete(`${id}:sleeping`)
    let t0 = performance.now()
    await api('POST', `/api/models/instances/${id}/sleep?level=1`)
    const sleptAt = await stateAt(id, 'sleeping', `instance ${id} sleeping`)
    if (!warm)
      record(
        rows.sleep,
        engineSeconds(logFile, /It took ([\d.]+) seconds to fall asleep/) * 1000,
        sleptAt - t0,
      )
    reached.delete(`${id}:active`)
    t0 = performance.now()
    await api('POST', `/api/models/instances/${id}/wake`, {})
    const wokeAt = await stateAt(id, 'active', `instance ${id} awake`)
    if (!warm)
      record(rows.wake, engineSeconds(logFile, /It took ([\d.]+) seconds to wake up/) * 1000, wokeAt - t0)

    // a held request's first token after a wake, through the gateway's /v1 and the router's
    for (const [row, base] of [
      [rows.held, th.url],
      [rows.routerHeld, routerUrl],
    ] as const) {
      await idle(id)
      reached.delete(`${id}:sleeping`)
      await api('POST', `/api/models/instances/${id}/sleep?level=1`)
      await stateAt(id, 'sleeping', `instance ${id} sleeping again`)
      reached.delete(`${id}:active`)
      t0 = performance.now()
      const firstToken = await firstContent(`${base}/v1/chat/completions`)
      await stateAt(id, 'active', `instance ${id} woken by a held request`)
      const wakeMs = engineSeconds(logFile, /It took ([\d.]+) seconds to wake up/) * 1000
      const s0 = performance.now()
      const engineTtft = (await firstContent(`${engineUrl}/v1/chat/completions`)) - s0
      if (!warm) record(row, wakeMs + engineTtft, firstToken - t0)
    }

    await idle(id)
    await api('POST', `/api/v1/models/${id}/unload`)
    await stateAt(id, 'removed', `instance ${id} removed`)
    process.stderr.write(warm ? 'warm-up done\n' : `rep ${rep + 1}/${REPS}\n`)
  }
}

/** firstHealthy probes the engine's /health every ~1 ms until it answers 200; returns when. */
async function firstHealthy(url: string): Promise<number> {
  for (;;) {
    const ok = await fetch(`${url}/health`)
      .then(async (r) => {
        await r.arrayBuffer()
        return r.status === 200
      })
      .catch(() => false)
    const at = performance.now()
    if (ok) return at
    await Bun.sleep(1)
  }
}

/** engineSeconds: the figure of the engine's last log line matching `re`. */
function engineSeconds(logFile: string, re: RegExp): number {
  for (const line of readLastLines(logFile, 50).reverse()) {
    const m = re.exec(line)
    if (m) return Number(m[1])
  }
  throw new Error(`no line matching ${re} in ${logFile}`)
}

/** firstContent sends the streamed chat request and returns when its first content chunk arrived. */
async function firstContent(url: string): Promise<number> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: CHAT,
  })
  if (res.status !== 200) throw new Error(`${url}: ${res.status} ${await res.text()}`)
  const reader = res.body!.getReader()
  const decoder = new TextDecoder()
  let buf = ''
  let at: number | null = null
  for (;;) {
    const next = await reader.read()
    if (next.done) break
    buf += decoder.decode(next.value, { stream: true })
    if (at === null && /"content":"[^"]/.test(buf)) at = performance.now()
  }
  if (at === null) throw new Error(`${url}: no content in ${buf.slice(0, 300)}`)
  return at
}

function print(): void {
  const group = (s: string) => s.padStart(24).padEnd(26)
  const sub = `${'min'.padStart(8)}${'median'.padStart(8)}${'p95'.padStart(8)}  `
  console.log(
    `\nbench:lifecycle: ${REPS} repetitions, simulator load ${LOAD_MS} ms, wake ${WAKE_MS} ms ` +
      `(level 1 wakes in a third of it), times in ms\n`,
  )
  console.log(`${''.padEnd(46)}${group('engine')}${group('modelgate')}${group('ours = modelgate − engine')}`)
  console.log(`${'operation'.padEnd(46)}${sub}${sub}${sub}target (median of ours)`)
  for (const r of Object.values(rows)) {
    const verdict =
      r.target === undefined ? '' : `≤ ${r.target}: ${quantile(r.ours, 0.5) <= r.target ? 'met' : 'MISSED'}`
    console.log(`${r.name.padEnd(46)}${triple(r.engine)}${triple(r.modelgate)}${triple(r.ours)}${verdict}`)
  }
}

await main()
