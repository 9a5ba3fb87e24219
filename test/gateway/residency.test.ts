import { afterAll, afterEach, describe, expect, it } from 'bun:test'
import { removeEngineRecord, writeEngineRecord } from '../../src/sim/state.ts'
import { groupAlive } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { freePortRange } from '../support/ports.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Serving catalogued models on demand (plugins/gateway/residency) through real sockets with auth
 * on: real simulated engines on simulated 80 GB GPUs, each catalogued model claiming 60 % of a GPU
 * (so only one fits on a GPU), a sleep freeing all but the engine's CUDA context.
 */
const KEY = 'sk-residency-tests'
const AUTH = {
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: 'residency-password',
  JWT_SECRET: 'residency-jwt-secret-of-at-least-32-bytes',
  INFERENCE_API_KEY: KEY,
}

interface Entry {
  name: string
  pin?: boolean
  sleep?: boolean
  /** The parameter count in its model path (the simulator's size: with SIM_TIME_SCALE, its load time). */
  size?: string
}

function catalogYaml(entries: Entry[], residency = 'policy: cost, min_resident_seconds: 0'): string {
  const lines = entries.map(
    (e) =>
      `      - { name: ${e.name}, model_path: org/${e.name}-${e.size ?? '7b'}, gpu_memory_utilization: 0.6, enable_sleep_mode: ${e.sleep ?? true}${e.pin ? ', pin: true' : ''} }`,
  )
  return `    residency: { ${residency} }\n    catalog:\n${lines.join('\n')}\n`
}

const gateways: TestGateway[] = []
afterEach(async () => {
  for (const gw of gateways.splice(0)) await gw.stop()
})
afterAll(async () => {
  for (const gw of gateways.splice(0)) await gw.stop()
})

async function boot(
  entries: Entry[],
  o: {
    ports: [number, number]
    gpus?: string
    env?: Record<string, string>
    residency?: string
    drainMs?: number
  } = {
    ports: [0, 0],
  },
) {
  const gw = await startGateway({
    ports: o.ports,
    ...(o.drainMs ? { drainMs: o.drainMs } : {}),
    gpus: o.gpus ?? '2x80',
    env: { SIM_LOAD_DELAY_MS: '300', ...o.env },
    hostEnv: AUTH,
    extraYaml: catalogYaml(entries, o.residency),
  })
  gateways.push(gw)
  const token = (await gw.host.auth.issueToken('ops', ['admin'])).token
  return { gw, token }
}

function chat(gw: TestGateway, model: string, signal?: AbortSignal): Promise<Response> {
  return fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    ...(signal ? { signal } : {}),
  })
}

async function residency(gw: TestGateway, token: string) {
  const res = await fetch(`${gw.url}/api/residency`, { headers: { authorization: `Bearer ${token}` } })
  expect(res.status).toBe(200)
  return (await res.json()) as {
    models: { name: string; state: string; instance_id: string | null; queue_length: number }[]
    decisions: { trigger: { model: string }; victims: { model: string; action: string }[] }[]
  }
}

describe('residency: serving catalogued models on demand', () => {
  it('serves three models that cannot all fit, each on its first request, none failing', async () => {
    const { gw, token } = await boot([{ name: 'alpha' }, { name: 'beta' }, { name: 'gamma' }], {
      ports: [19100, 19119],
    })
    for (const model of ['alpha', 'beta', 'gamma']) {
      const res = await chat(gw, model)
      expect(res.status).toBe(200)
      expect(((await res.json()) as { model: string }).model).toBe(model)
    }
    const view = await residency(gw, token)
    const d = view.decisions.find((x) => x.trigger.model === 'gamma')!
    expect(d.victims).toHaveLength(1)
    expect(['alpha', 'beta']).toContain(d.victims[0]!.model)
    expect(view.models.find((m) => m.name === 'gamma')!.state).toBe('active')
    // The victim comes back on its next request (it only slept), making room again.
    const again = await chat(gw, d.victims[0]!.model)
    expect(again.status).toBe(200)
  }, 60_000)

  it('never makes a pinned model the victim', async () => {
    const { gw, token } = await boot([{ name: 'keep', pin: true }, { name: 'other' }, { name: 'third' }], {
      ports: [19120, 19139],
    })
    for (const model of ['keep', 'other', 'third']) expect((await chat(gw, model)).status).toBe(200)
    const view = await residency(gw, token)
    for (const d of view.decisions) expect(d.victims.map((v) => v.model)).not.toContain('keep')
    expect(view.models.find((m) => m.name === 'keep')!.state).toBe('active')
  }, 60_000)

  it('serves two models that cannot both fit, asked for together, one after the other', async () => {
    const { gw } = await boot([{ name: 'left' }, { name: 'right' }], { ports: [19140, 19159], gpus: '1x80' })
    const [a, b] = await Promise.all([chat(gw, 'left'), chat(gw, 'right')])
    expect(a.status).toBe(200)
    expect(b.status).toBe(200)
  }, 60_000)

  it('answers a flood beyond the queue with 429 queue_full and Retry-After', async () => {
    const { gw } = await boot([{ name: 'slow' }], {
      ports: [19160, 19179],
      env: { SIM_LOAD_DELAY_MS: '2500' },
      residency: 'policy: cost, min_resident_seconds: 0, max_queue: 4',
    })
    const answers = await Promise.all(Array.from({ length: 30 }, () => chat(gw, 'slow')))
    const ok = answers.filter((r) => r.status === 200)
    const full = answers.filter((r) => r.status === 429)
    expect(ok.length).toBe(4)
    expect(full.length).toBe(26)
    for (const r of full) {
      expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe('queue_full')
    }
    expect(gw.host.directory.held('slow')).toBe(0)
  }, 60_000)

  it('cancels a load nothing waits for any more when its only client leaves', async () => {
    const { gw } = await boot([{ name: 'abandon' }], {
      ports: [19180, 19199],
      env: { SIM_LOAD_DELAY_MS: '8000' },
    })
    const client = new AbortController()
    const pending = chat(gw, 'abandon', client.signal).catch(() => null)
    const inst = await waitFor('the load to start', () =>
      gw.host
        .api<{ list(): { id: string; status: string; process_id: number | null }[] }>('gateway')
        .list()
        .find((i) => i.status === 'starting' && i.process_id),
    )
    client.abort()
    await pending
    await waitFor(
      'the load cancelled',
      () => gw.host.api<{ get(id: string): unknown }>('gateway').get(inst.id) === undefined,
      { timeoutMs: 20_000 },
    )
    await waitFor('the engine gone', () => !groupAlive(inst.process_id!), { timeoutMs: 20_000 })
  }, 60_000)

  it('finishes the load of an entry removed while it loads, serves its request, then forgets the name', async () => {
    const { gw, token } = await boot([{ name: 'resident' }], {
      ports: [19220, 19239],
      env: { SIM_TIME_SCALE: '0.03' },
    })
    const admin = { 'content-type': 'application/json', authorization: `Bearer ${token}` }
    const saved = await fetch(`${gw.url}/api/catalog/passing`, {
      method: 'PUT',
      headers: admin,
      body: JSON.stringify({
        model_path: 'org/passing-14b',
        gpu_memory_utilization: 0.6,
        enable_sleep_mode: true,
      }),
    })
    expect(saved.status).toBe(201)
    const asked = chat(gw, 'passing')
    await waitFor('the load to start', () =>
      gw.host
        .api<{ list(): { served_model_name: string; status: string }[] }>('gateway')
        .list()
        .some((i) => i.served_model_name === 'passing' && i.status === 'starting'),
    )
    const removed = await fetch(`${gw.url}/api/catalog/passing`, { method: 'DELETE', headers: admin })
    expect(removed.status).toBe(200)
    // The load under way finishes and serves what waited for it.
    expect((await asked).status).toBe(200)
    const view = await residency(gw, token)
    expect(view.models.map((m) => m.name)).toEqual(['resident'])
    // Once it is gone, the name is unknown again.
    const inst = gw.host
      .api<{ list(): { id: string; served_model_name: string }[] }>('gateway')
      .list()
      .find((i) => i.served_model_name === 'passing')!
    expect(
      (await fetch(`${gw.url}/api/v1/models/${inst.id}/unload`, { method: 'POST', headers: admin })).status,
    ).toBeLessThan(300)
    await waitFor(
      'the instance gone',
      () => gw.host.api<{ get(id: string): unknown }>('gateway').get(inst.id) === undefined,
    )
    const after = await chat(gw, 'passing')
    expect(after.status).toBe(400)
  }, 60_000)

  it('serves a catalogued model on demand through the router too', async () => {
    const gw = await startGateway({
      ports: [19240, 19259],
      gpus: '2x80',
      env: { SIM_LOAD_DELAY_MS: '300' },
      hostEnv: AUTH,
      extraYaml: `${catalogYaml([{ name: 'routed' }])}  router:\n    host: 127.0.0.1\n    port: 0\n    from_gateway: true\n`,
    })
    gateways.push(gw)
    const res = await fetch(`${gw.host.urls.router}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: 'routed', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    })
    expect(res.status).toBe(200)
    expect(((await res.json()) as { model: string }).model).toBe('routed')
  }, 60_000)

  it('answers requests still queued with 503 as the server stops, while it still drains a running stream', async () => {
    // Loads take vLLM's published time × 0.03 (SIM_TIME_SCALE): the 0.5B model about 1 s, the 70B one 8 s.
    const { gw } = await boot(
      [
        { name: 'talker', size: '0.5b' },
        { name: 'never', size: '70b' },
      ],
      {
        ports: [19200, 19219],
        env: { SIM_TIME_SCALE: '0.03', SIM_TOKENS_PER_SEC: '40' },
        drainMs: 20_000,
      },
    )
    expect((await chat(gw, 'talker')).status).toBe(200)
    // A stream the shutdown's drain waits for (about 4 s of tokens).
    const stream = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({
        model: 'talker',
        messages: [{ role: 'user', content: 'talk' }],
        max_tokens: 160,
        stream: true,
      }),
    })
    expect(stream.status).toBe(200)
    const streamDone = stream.text().then(() => 'stream ended')
    // 'never' is still loading: its requests wait in its queue.
    const held = Promise.all([chat(gw, 'never'), chat(gw, 'never')])
    await waitFor('the requests queued', () => gw.host.directory.held('never') === 2)
    gateways.splice(gateways.indexOf(gw), 1)
    const stopping = gw.stop()
    // Answered as the shutdown begins, not once the drain of the running stream is over.
    const first = await Promise.race([held.then(() => 'queued answered'), streamDone])
    expect(first).toBe('queued answered')
    for (const r of await held) {
      expect(r.status).toBe(503)
      expect(((await r.json()) as { error: { message: string } }).error.message).toContain('stopping')
    }
    expect(await streamDone).toBe('stream ended')
    await stopping
  }, 60_000)

  it('plans again, without failing the request, when the GPU is fuller than planned as the load starts', async () => {
    const { gw, token } = await boot([{ name: 'first' }, { name: 'second' }], {
      ports: [19220, 19239],
      gpus: '1x80',
      // A load slower than a wake, so that once the first load is measured, putting 'first' to
      // sleep stays cheaper than unloading it.
      env: { SIM_WAKE_DELAY_MS: '600', SIM_LOAD_DELAY_MS: '2500' },
    })
    expect((await chat(gw, 'first')).status).toBe(200)
    // Another program takes 40 GB of the GPU while 'first' is put to sleep for 'second': the plan
    // counted on memory the load then does not find.
    const squatter = Bun.spawn(['sleep', '600'])
    let squatting = false
    gw.host.bus.on('gateway.instance.lifecycle', (e) => {
      const c = e.change
      if (squatting || e.served_model_name !== 'first' || c.kind !== 'operation') return
      if (c.operation !== 'sleep' || !c.running) return
      squatting = true
      writeEngineRecord(gw.simDir, {
        pid: squatter.pid,
        gpus: [0],
        used_mib_per_gpu: 40 * 1024,
        process_name: 'render-job',
        model: 'none',
        started_at: new Date().toISOString(),
      })
    })
    try {
      const second = chat(gw, 'second')
      const early = await Promise.race([
        second,
        waitFor('the load to find the GPU fuller than planned', () =>
          gw.logs.some((l) => l.includes('fuller than planned')),
        ).then(() => null),
      ])
      // Not answered meanwhile (it was a 502 wake_failed): still held, not failed.
      if (early) expect(`${early.status} ${await early.text()}`).toBe('the request still held')
      // The program ends, and the next plan fits.
      removeEngineRecord(gw.simDir, squatter.pid)
      const res = await second
      expect(res.status).toBe(200)
      expect(((await res.json()) as { model: string }).model).toBe('second')
      const view = await residency(gw, token)
      expect(view.models.find((m) => m.name === 'second')!.state).toBe('active')
    } finally {
      squatter.kill()
    }
  }, 60_000)

  it('learns the load time of a model loaded on demand, and counts it instead of the published one', async () => {
    const { gw, token } = await boot([{ name: 'timed' }], {
      ports: [26000, 26019],
      env: { SIM_LOAD_DELAY_MS: '1500' },
    })
    const costs = async () =>
      (await residency(gw, token)).models.find((m) => m.name === 'timed') as unknown as {
        costs: { load_s: number; measured: { load: boolean } }
      }
    const before = await costs()
    expect(before.costs.measured.load).toBe(false)
    // The load as the test sees it on the bus: the spawn (null → starting) to active.
    let spawned: number | null = null
    let active: number | null = null
    gw.host.bus.on('gateway.instance.status', (e) => {
      if (e.instance.served_model_name === 'timed' && e.previousStatus === null) spawned = performance.now()
    })
    gw.host.bus.on('gateway.instance.lifecycle', (e) => {
      const c = e.change
      if (e.served_model_name === 'timed' && c.kind === 'state' && c.previous === 'starting')
        active = c.current === 'active' ? e.at : null
    })
    const sent = performance.now()
    const res = await chat(gw, 'timed')
    const answered = performance.now()
    expect(res.status).toBe(200)
    expect(spawned).not.toBeNull()
    expect(active).not.toBeNull()
    const loadS = (active! - spawned!) / 1000
    const after = await waitFor('the load measured', async () => {
      const m = await costs()
      return m.costs.measured.load ? m : undefined
    })
    // Near what the load took: within half and twice the observed load, and within the request's wait.
    expect(after.costs.load_s).toBeGreaterThanOrEqual(loadS / 2)
    expect(after.costs.load_s).toBeLessThanOrEqual(Math.min(loadS * 2, (answered - sent) / 1000))
    expect(after.costs.load_s).toBeLessThan(before.costs.load_s)
  }, 60_000)

  it('serves an SGLang model of the catalogue on demand, on its own engine', async () => {
    const gw = await startGateway({
      ports: [19240, 19259],
      gpus: '2x80',
      env: { SIM_LOAD_DELAY_MS: '300' },
      hostEnv: AUTH,
      extraYaml:
        '    residency: { policy: cost }\n' +
        '    catalog:\n' +
        '      - { name: lang, engine_kind: sglang, model_path: org/lang-7b, gpu_memory_utilization: 0.6 }\n',
    })
    gateways.push(gw)
    const token = (await gw.host.auth.issueToken('ops', ['admin'])).token
    const res = await chat(gw, 'lang')
    expect(res.status).toBe(200)
    expect(((await res.json()) as { model: string }).model).toBe('lang')
    const listed = await fetch(`${gw.url}/api/v1/models`, { headers: { authorization: `Bearer ${token}` } })
    const models = ((await listed.json()) as { models: { id: string }[] }).models
    expect(models).toHaveLength(1)
    const detail = await fetch(`${gw.url}/api/v1/models/${models[0]!.id}`, {
      headers: { authorization: `Bearer ${token}` },
    })
    const model = ((await detail.json()) as { model: { engine_kind: string; launch_command: string } }).model
    expect(model.engine_kind).toBe('sglang')
    expect(model.launch_command).toContain('sim sglang')
    const catalog = await fetch(`${gw.url}/api/catalog`, { headers: { authorization: `Bearer ${token}` } })
    const entries = ((await catalog.json()) as { entries: { name: string; engine_kind: string | null }[] })
      .entries
    expect(entries.find((e) => e.name === 'lang')!.engine_kind).toBe('sglang')
  }, 60_000)

  it("counts an SGLang model's own measured load, never a vLLM load of the same name", async () => {
    const port = freePortRange(10)
    const gw = await startGateway({
      ports: [port, port + 9],
      gpus: '2x80',
      env: { SIM_LOAD_DELAY_MS: '300' },
      hostEnv: AUTH,
      extraYaml:
        '    residency: { policy: cost }\n' +
        '    catalog:\n' +
        '      - { name: lang, engine_kind: sglang, model_path: org/lang-7b, gpu_memory_utilization: 0.6 }\n',
    })
    gateways.push(gw)
    const token = (await gw.host.auth.issueToken('ops', ['admin'])).token
    const costs = async () =>
      (await residency(gw, token)).models.find((m) => m.name === 'lang') as unknown as {
        costs: { load_s: number; measured: { load: boolean } }
      }
    const published = (await costs()).costs.load_s
    // The same name loaded by hand on vLLM: its load is measured, as vLLM's.
    const id = await gw.load(
      { model_path: 'org/lang-7b', served_model_name: 'lang', engine_kind: 'vllm' },
      token,
    )
    await gw.waitStatus(id, 'active', 30_000, token)
    await waitFor('the vLLM load measured', async () =>
      (await costs()).costs.measured.load ? true : undefined,
    )
    const unload = await fetch(`${gw.url}/api/v1/models/${id}/unload`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}` },
    })
    expect(unload.status).toBe(202)
    await waitFor('the vLLM instance to be gone', async () => {
      const r = await fetch(`${gw.url}/api/v1/models/${id}`, {
        headers: { authorization: `Bearer ${token}` },
      })
      return r.status === 404
    })
    // The catalogue runs it on SGLang, which was never measured: the default figure again.
    const before = await costs()
    expect(before.costs.measured.load).toBe(false)
    expect(before.costs.load_s).toBe(published)
    expect((await chat(gw, 'lang')).status).toBe(200)
    const after = await waitFor('the SGLang load measured', async () => {
      const m = await costs()
      return m.costs.measured.load ? m : undefined
    })
    expect(after.costs.load_s).toBeLessThan(published)
  }, 60_000)
})
