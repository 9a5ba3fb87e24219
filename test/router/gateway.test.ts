import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { waitFor } from '../support/wait.ts'
import { chat, startRouterWithGateway, type TestRouter } from './support.ts'

/**
 * from_gateway: the router follows the gateway plugin's instances by served model name as they
 * load, sleep, wake and unload, and sleeps and wakes them through the gateway's api so both
 * views agree.
 */
const NAME = 'gw-model'

let r: TestRouter & { simDir: string }
let instanceId = ''

type Status = { models: Record<string, { status: string }> }

const main = <T = Record<string, unknown>>(path: string, init?: RequestInit) => r.main<T>(path, init)
const instanceStatus = async () =>
  (await main<{ model: { status: string } }>(`/api/v1/models/${instanceId}`)).body.model.status
const routerState = async () => (await r.get<Status>('/sleep/status')).body.models[NAME]?.status

beforeAll(async () => {
  r = await startRouterWithGateway(
    [18400, 18409],
    `
from_gateway: true
auto_sleep: { min_sleep_duration: 0 }
`,
  )
})

afterAll(async () => {
  await r?.stop()
})

describe('router following the gateway', () => {
  it('routes to a gateway instance once it is active', async () => {
    expect((await r.get('/models')).body).toEqual({ object: 'list', data: [] })
    const load = await main<{ instance_id: string; port: number }>('/api/v1/models/load', {
      method: 'POST',
      body: JSON.stringify({ model_path: 'org/gw-base', served_model_name: NAME, enable_sleep_mode: true }),
    })
    expect(load.status).toBe(202)
    instanceId = load.body.instance_id
    await waitFor('instance active', async () => (await instanceStatus()) === 'active', { timeoutMs: 20_000 })
    const models = await r.get<{ data: { id: string; endpoint: { port: number } }[] }>('/models')
    expect(models.body.data).toEqual([
      {
        id: NAME,
        object: 'model',
        created: expect.any(Number),
        owned_by: 'modelgate',
        endpoint: { host: '127.0.0.1', port: load.body.port },
      },
    ] as never)
    const res = await r.post<{ model: string }>('/v1/chat/completions', chat(NAME))
    expect(res.status).toBe(200)
    expect(res.body.model).toBe(NAME)
    expect((await r.get(`/traffic/stats/${NAME}`)).body).toMatchObject({
      total_requests: 1,
      successful_requests: 1,
    })
    // The gateway counts the request too: it reached one of its instances.
    const metrics = await (await fetch(`${r.url}/metrics`)).text()
    expect(metrics).toContain(`modelgate_requests_total{model_id="${instanceId}",status="200"} 1`)

    // Traffic through the gateway's own /v1 (announced as `proxy.request`) counts as activity, so the
    // model is not idle, but not as router traffic.
    const lastActivity = async () =>
      (await r.get<{ models: Record<string, { last_activity: string }> }>('/sleep/status')).body.models[NAME]!
        .last_activity
    const before = await lastActivity()
    r.clock.advance(20)
    r.host.bus.emit('proxy.request', {
      model: NAME,
      instance_id: instanceId,
      status: 200,
      duration_ms: 5,
      ttft_ms: null,
      streamed: false,
      path: '/v1/chat/completions',
    })
    expect(Date.parse(await lastActivity())).toBeGreaterThan(Date.parse(before))
    expect((await r.get(`/traffic/stats/${NAME}`)).body).toMatchObject({ total_requests: 1 })
  })

  it('sleeps through the gateway so both views agree', async () => {
    const slept = await r.post(`/action/sleep/${NAME}`)
    expect(slept.status).toBe(200)
    expect(await instanceStatus()).toBe('sleeping')
    expect(await routerState()).toBe('sleeping')

    // A request wakes it (reject mode: 503 model_waking while it wakes), through the gateway.
    const waking = await r.post('/v1/chat/completions', chat(NAME))
    expect(waking.status).toBe(503)
    expect((waking.body as { error: { code: string } }).error.code).toBe('model_waking')
    await waitFor('router sees the model awake', async () => (await routerState()) === 'active', {
      timeoutMs: 10_000,
    })
    expect(await instanceStatus()).toBe('active')
    expect((await r.post('/v1/chat/completions', chat(NAME))).status).toBe(200)
  })

  it("follows a sleep done through the gateway's own api, and wakes it", async () => {
    const res = await main(`/api/models/instances/${instanceId}/sleep?level=1`, { method: 'POST' })
    expect(res.status).toBe(200)
    expect(await routerState()).toBe('sleeping')
    const woke = await r.post(`/action/wakeup/${NAME}`)
    expect(woke.status).toBe(200)
    expect(woke.body).toMatchObject({ status: 'success', model: NAME })
    expect(await instanceStatus()).toBe('active')
  })

  it('drops the model when its instance unloads', async () => {
    const res = await main(`/api/v1/models/${instanceId}/unload`, { method: 'POST' })
    expect(res.status).toBe(202)
    await waitFor(
      'model gone from the router',
      async () => (await r.get<{ data: unknown[] }>('/models')).body.data.length === 0,
      { timeoutMs: 15_000 },
    )
    expect((await r.post('/v1/chat/completions', chat(NAME))).status).toBe(404)
    expect((await r.get(`/traffic/stats/${NAME}`)).status).toBe(404)
  })
})
