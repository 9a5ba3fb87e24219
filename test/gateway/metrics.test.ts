import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { resolve } from 'node:path'
import { plugins } from '../../plugins/index.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Lifecycle metrics (plugins/gateway/metrics.ts) from real loads, sleeps and wakes of simulated
 * engines, the /metrics exposition checked by promtool, and readiness from the engine's
 * `Application startup complete.` line (plugins/gateway/supervision.ts).
 */

/** exposition: the /metrics text as a map from series (name and labels) to value. */
async function exposition(url: string): Promise<{ text: string; series: Map<string, number> }> {
  const text = await (await fetch(`${url}/metrics`)).text()
  const series = new Map<string, number>()
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue
    const space = line.lastIndexOf(' ')
    series.set(line.slice(0, space), Number(line.slice(space + 1)))
  }
  return { text, series }
}

const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
const LIFECYCLE = /^modelgate_model_(load|sleep|wake)_/

/**
 * The spec's metric names (gateway-api.md, "Metrics"), which promtool's naming rules do not like:
 * - `modelgate_models_total` is a gauge; promtool wants `_total` for counters only.
 * - `modelgate_request_duration_ms` is in milliseconds; promtool wants base units (seconds).
 * Both names are the spec's, so dashboards written against it keep working.
 */
const SPEC_NAMED = new Set(['modelgate_models_total', 'modelgate_request_duration_ms'])
/**
 * prom-client's default process metrics (src/host/metrics.ts, collectDefaultMetrics) name three
 * gauges `nodejs_active_*_total`: prom-client's names, not ours. Allowed here, not required, so that
 * removing them from the registry leaves this test passing.
 */
const PROM_CLIENT_DEFAULTS = new Set([
  'modelgate_nodejs_active_handles_total',
  'modelgate_nodejs_active_requests_total',
  'modelgate_nodejs_active_resources_total',
])

const promtool = Bun.which('promtool')
if (!promtool && !process.env.CI)
  console.warn(
    'metrics.test.ts: promtool not found (Debian package "prometheus"); skipping the exposition check. ' +
      '.ci/run installs it, and with CI set its absence fails the run.',
  )

describe('lifecycle metrics', () => {
  let gw: TestGateway
  const ids: string[] = []
  beforeAll(async () => {
    // Wakes are not timed here: the simulator wakes in tens of milliseconds.
    gw = await startGateway({ ports: [19700, 19719], env: { SIM_WAKE_DELAY_MS: '60' } })
  })
  afterAll(() => gw.stop())

  const post = async (path: string, body: unknown = {}) => {
    const r = await gw.json(path, { method: 'POST', body: JSON.stringify(body) })
    if (r.status >= 300) throw new Error(`POST ${path}: ${r.status} ${JSON.stringify(r.body)}`)
    return r.body
  }

  it('times loads, sleeps and wakes by served model name and level, and counts failed loads', async () => {
    const id = await gw.load({ model_path: MODEL, gpu_ids: [0], enable_sleep_mode: true })
    ids.push(id)
    await gw.waitStatus(id, 'active')
    for (const level of [1, 2]) {
      await post(`/api/models/instances/${id}/sleep?level=${level}`)
      await gw.waitStatus(id, 'sleeping')
      await post(`/api/models/instances/${id}/wake`)
      await gw.waitStatus(id, 'active')
    }
    // The engine refuses a context longer than the model's: the load fails.
    const bad = await gw.load({ model_path: 'org/other-3b', gpu_ids: [1], max_tokens: 10_000_000 })
    ids.push(bad)
    await gw.waitStatus(bad, 'failed')

    const { series } = await exposition(gw.url)
    const get = (s: string) => series.get(s)
    expect(get(`modelgate_model_load_duration_seconds_count{model="${MODEL}"}`)).toBe(1)
    expect(get(`modelgate_model_load_duration_seconds_sum{model="${MODEL}"}`)).toBeGreaterThan(0)
    expect(get(`modelgate_model_load_duration_seconds_bucket{le="+Inf",model="${MODEL}"}`)).toBe(1)
    expect(get('modelgate_model_load_failures_total{model="org/other-3b"}')).toBe(1)
    expect(get('modelgate_model_load_duration_seconds_count{model="org/other-3b"}')).toBeUndefined()
    for (const level of ['1', '2']) {
      for (const op of ['sleep', 'wake']) {
        const labels = `{model="${MODEL}",level="${level}"}`
        expect(get(`modelgate_model_${op}_duration_seconds_count${labels}`)).toBe(1)
        expect(get(`modelgate_model_${op}_duration_seconds_sum${labels}`)).toBeGreaterThan(0)
      }
    }
  })

  it('adds no series when the same model is loaded again as another instance', async () => {
    const before = [...(await exposition(gw.url)).series.keys()].filter((s) => LIFECYCLE.test(s))
    await post(`/api/v1/models/${ids[0]}/unload`)
    await waitFor(
      `instance ${ids[0]} removed`,
      async () => (await gw.json(`/api/v1/models/${ids[0]}`)).status === 404,
    )
    const again = await gw.load({ model_path: MODEL, gpu_ids: [0], enable_sleep_mode: true })
    ids.push(again)
    await gw.waitStatus(again, 'active')
    await post(`/api/models/instances/${again}/sleep?level=1`)
    await gw.waitStatus(again, 'sleeping')
    await post(`/api/models/instances/${again}/wake`)
    await gw.waitStatus(again, 'active')

    const { series } = await exposition(gw.url)
    const after = [...series.keys()].filter((s) => LIFECYCLE.test(s))
    expect(after.sort()).toEqual(before.sort())
    expect(series.get(`modelgate_model_load_duration_seconds_count{model="${MODEL}"}`)).toBe(2)
    expect(series.get(`modelgate_model_wake_duration_seconds_count{model="${MODEL}",level="1"}`)).toBe(2)
    for (const s of after) for (const id of ids) expect(s).not.toContain(id)
  })

  it.skipIf(!promtool && !process.env.CI)(
    'passes promtool check metrics, apart from the spec-named series',
    async () => {
      // A request through the proxy, so the spec's request series are there too.
      const chat = await fetch(`${gw.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
      })
      expect(chat.status).toBe(200)
      await chat.arrayBuffer()
      const { text, series } = await exposition(gw.url)
      expect(series.has(`modelgate_model_load_duration_seconds_count{model="${MODEL}"}`)).toBe(true)
      expect([...series.keys()].some((s) => s.startsWith('modelgate_request_duration_ms_bucket'))).toBe(true)
      const proc = Bun.spawn([promtool ?? 'promtool', 'check', 'metrics'], {
        stdin: new TextEncoder().encode(text),
        stdout: 'pipe',
        stderr: 'pipe',
      })
      const [out, err] = await Promise.all([
        new Response(proc.stdout).text(),
        new Response(proc.stderr).text(),
      ])
      await proc.exited
      const problems = `${out}\n${err}`.split('\n').filter((l) => l.trim())
      // Each problem line starts with the metric it is about: only the spec's names (and prom-client's
      // defaults) may have one, and the spec's do (so promtool did read the exposition).
      const about = problems.map((l) => l.split(' ')[0]!)
      expect(about.filter((name) => !SPEC_NAMED.has(name) && !PROM_CLIENT_DEFAULTS.has(name))).toEqual([])
      expect(new Set(about.filter((name) => SPEC_NAMED.has(name)))).toEqual(SPEC_NAMED)
    },
  )
})

describe('sleep verification failures', () => {
  let gw: TestGateway
  beforeAll(async () => {
    // An engine whose sleep keeps its weights on the GPU (vllm#32714): every sleep frees too little.
    gw = await startGateway({
      ports: [19740, 19749],
      env: { SIM_WAKE_DELAY_MS: '60', SIM_SLEEP_KEEPS_WEIGHTS: '1' },
    })
  })
  afterAll(() => gw.stop())

  it('are counted by served model name and level', async () => {
    const id = await gw.load({ model_path: MODEL, gpu_ids: [0], enable_sleep_mode: true })
    await gw.waitStatus(id, 'active')
    const slept = await gw.json(`/api/models/instances/${id}/sleep?level=1`, { method: 'POST', body: '{}' })
    expect(slept.body).toMatchObject({ status: 'sleeping', sleep_verified: false })
    const { series } = await exposition(gw.url)
    expect(series.get(`modelgate_model_sleep_verification_failures_total{model="${MODEL}",level="1"}`)).toBe(
      1,
    )
    expect(series.get(`modelgate_model_sleep_duration_seconds_count{model="${MODEL}",level="1"}`)).toBe(1)
  })
})

/**
 * Readiness from the start-up line: with the polling pushed past the start-up deadline, only the
 * line's probes can make an engine active; an engine that never prints it is found by the polling.
 */
describe('readiness from the engine start-up line', () => {
  const ENGINE = resolve(import.meta.dir, 'readiness-engine.ts')

  /** withGateway boots a gateway whose engine is readiness-engine.ts, runs `fn`, and stops it. */
  async function withGateway(
    env: Record<string, string>,
    pollMs: number,
    ports: [number, number],
    fn: (th: TestHost) => Promise<void>,
  ): Promise<void> {
    const th = await startHost(
      `
log: { level: debug }
shutdown: { timeout_ms: 10000, drain_ms: 500 }
plugins:
  gateway:
    engine:
      command: ['${process.execPath}', '${ENGINE}']
      env: ${JSON.stringify(env)}
      port_range: { start: ${ports[0]}, end: ${ports[1]} }
      startup_timeout_seconds: 30
      stop_grace_seconds: 2
      health_poll_ms: { initial: ${pollMs}, max: ${pollMs} }
    gpu: { smi_command: null }
`,
      plugins,
    )
    try {
      await fn(th)
    } finally {
      await th.stop()
    }
  }

  /** loadUntilActive loads the stand-in engine and waits until its instance is active. */
  async function loadUntilActive(th: TestHost): Promise<void> {
    const res = await fetch(`${th.url}/api/v1/models/load`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model_path: 'org/ready-1b' }),
    })
    expect(res.status).toBe(202)
    const id = ((await res.json()) as { instance_id: string }).instance_id
    await waitFor(
      `instance ${id} active`,
      async () => {
        const body = (await (await fetch(`${th.url}/api/v1/models/${id}`)).json()) as {
          model: { status: string; error: string | null }
        }
        if (body.model.status === 'failed') throw new Error(`instance ${id} failed: ${body.model.error}`)
        return body.model.status === 'active'
      },
      { timeoutMs: 20_000, wake: (notify) => th.host.bus.on('gateway.instance.status', notify) },
    )
  }

  it('probes /health when the line appears, and again shortly after when the port opens late', async () => {
    // The first poll runs at spawn (port closed); the next would come after the start-up deadline.
    await withGateway({ READY_LINE: 'early', LINE_LEAD_MS: '150' }, 60_000, [19720, 19729], loadUntilActive)
  })

  it('keeps polling /health for an engine that never prints the line', async () => {
    await withGateway({ READY_LINE: 'none' }, 50, [19730, 19739], loadUntilActive)
  })
})
