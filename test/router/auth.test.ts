import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { RouterService } from '../../plugins/router/service.ts'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import { NetRaw, parse } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'
import { chat, engineHits, modelsYaml, startRouterWithGateway, startSim, type TestRouter } from './support.ts'

/**
 * With `auth.inference_api_key` set, the router is no way around the gateway's inference key: its
 * /v1 and its /action routes need the key for the gateway's models (and for names it does not
 * know), while a standalone endpoint model keeps the spec's no-auth default. A refused request
 * reaches no engine, sleeps and wakes nothing and is not counted as the model's traffic.
 */
const KEY = 'router-test-key'
const GW = 'gw-keyed'
const SOLO = 'solo-model'

let r: TestRouter & { simDir: string }
let solo: EngineProc
let instanceId = ''
let enginePort = 0

type ErrorBody = { error: { message: string; type: string; code: string } }
type Status = { models: Record<string, { status: string; last_activity?: string | null }> }

const bearer = (key: string) => ({ authorization: `Bearer ${key}` })
const admin = <T = Record<string, unknown>>(path: string, init?: RequestInit) => r.main<T>(path, init)
const instanceStatus = async () =>
  (await admin<{ model: { status: string } }>(`/api/v1/models/${instanceId}`)).body.model.status
const routerState = async (name = GW) => (await r.get<Status>('/sleep/status')).body.models[name]
/** engineRequests: the requests the gateway's engine finished, from its own vLLM-style /metrics. */
const engineRequests = async () => {
  const text = await (await fetch(`http://127.0.0.1:${enginePort}/metrics`)).text()
  let n = 0
  for (const m of text.matchAll(/^vllm:request_success_total\{[^}]*\} (\d+)/gm)) n += Number(m[1])
  return n
}
const gatewayCount = async () => {
  const metrics = await (await fetch(`${r.url}/metrics`)).text()
  const m = new RegExp(`modelgate_requests_total\\{model_id="${instanceId}",status="200"\\} (\\d+)`).exec(
    metrics,
  )
  return m ? Number(m[1]) : 0
}
const traffic = async (name = GW) =>
  (
    await r.get<{ total_requests: number; failed_requests: number; last_activity: string | null }>(
      `/traffic/stats/${name}`,
    )
  ).body
const expectRefused = (res: { status: number; body: unknown }, code: string) => {
  expect(res.status).toBe(401)
  expect(res.body).toEqual({ error: { message: expect.any(String), type: 'authentication_error', code } })
}

beforeAll(async () => {
  solo = await startSim(SOLO)
  r = await startRouterWithGateway(
    [18410, 18419],
    `
from_gateway: true
auto_sleep: { min_sleep_duration: 0 }
${modelsYaml([{ name: SOLO, port: solo.port }])}
`,
    { INFERENCE_API_KEY: KEY },
  )
  const load = await admin<{ instance_id: string; port: number }>('/api/v1/models/load', {
    method: 'POST',
    body: JSON.stringify({ model_path: 'org/gw-keyed-base', served_model_name: GW, enable_sleep_mode: true }),
  })
  expect(load.status).toBe(202)
  instanceId = load.body.instance_id
  enginePort = load.body.port
  await waitFor('instance active', async () => (await instanceStatus()) === 'active', { timeoutMs: 20_000 })
  await waitFor('router follows it', async () => (await routerState())?.status === 'active', {
    timeoutMs: 5_000,
  })
})

afterAll(async () => {
  await r?.stop()
  await cleanupSims()
})

describe('router honours the gateway inference key', () => {
  it('refuses a gateway model without the key or with a wrong one, serves it with the key', async () => {
    expectRefused(await r.post('/v1/chat/completions', chat(GW)), 'missing_api_key')
    expectRefused(await r.post('/v1/chat/completions', chat(GW), bearer('wrong')), 'invalid_api_key')
    expectRefused(await r.post('/v1/completions', { model: GW, prompt: 'hi' }), 'missing_api_key')
    // A refusal comes before the body checks that name the model (here a bad max_tokens).
    expectRefused(await r.post('/v1/chat/completions', chat(GW, { max_tokens: 0 })), 'missing_api_key')

    // Nothing reached the engine, the gateway counted nothing, the router counted no traffic.
    expect(await engineRequests()).toBe(0)
    expect(await gatewayCount()).toBe(0)
    expect(await traffic()).toMatchObject({ total_requests: 0, failed_requests: 0 })
    expect((await routerState())?.last_activity).toBeNull()
    expect(
      (await r.get<{ overall: { total_requests: number } }>('/traffic/stats')).body.overall,
    ).toMatchObject({
      total_requests: 0,
    })

    const ok = await r.post<{ model: string; choices: unknown[] }>(
      '/v1/chat/completions',
      chat(GW),
      bearer(KEY),
    )
    expect(ok.status).toBe(200)
    expect(ok.body.model).toBe(GW)
    expect(ok.body.choices).toHaveLength(1)
    await waitFor('the engine counts the request', async () => (await engineRequests()) === 1, {
      timeoutMs: 5_000,
    })
    expect(await gatewayCount()).toBe(1)
    expect(await traffic()).toMatchObject({ total_requests: 1, successful_requests: 1 })
  })

  it('asks for the key for an unknown name too, so the answer does not tell what exists', async () => {
    expectRefused(await r.post('/v1/chat/completions', chat('no-such-model')), 'missing_api_key')
    expectRefused(await r.post('/action/sleep/no-such-model'), 'missing_api_key')
    const known = await r.post<ErrorBody>('/v1/chat/completions', chat('no-such-model'), bearer(KEY))
    expect(known.status).toBe(404)
    expect(known.body.error.code).toBe('model_not_found')
    expect((await r.post<ErrorBody>('/action/sleep/no-such-model', {}, bearer(KEY))).body.error.code).toBe(
      'model_not_found',
    )
    // An action without a model name is an unknown route, which names no model: 404, no key needed.
    for (const path of ['/action/sleep', '/action/sleep/', '/action/wakeup/']) {
      const res = await r.post<ErrorBody>(path)
      expect(res.status).toBe(404)
      expect(res.body.error.code).toBe('not_found')
    }
    // A body that names no model names no gateway model either: the usual 400, no key needed.
    const modelless = await r.post<ErrorBody>('/v1/chat/completions', { messages: [] })
    expect(modelless.status).toBe(400)
    expect(modelless.body.error.code).toBe('invalid_parameter')
  })

  it('refuses to sleep a gateway model without the key, sleeps it with the key', async () => {
    expectRefused(await r.post(`/action/sleep/${GW}`), 'missing_api_key')
    expectRefused(await r.post(`/action/sleep/${GW}`, {}, bearer('wrong')), 'invalid_api_key')
    expect((await routerState())?.status).toBe('active')
    expect(await instanceStatus()).toBe('active')

    const slept = await r.post(`/action/sleep/${GW}`, {}, bearer(KEY))
    expect(slept.status).toBe(200)
    expect(slept.body).toMatchObject({ status: 'success', model: GW })
    expect((await routerState())?.status).toBe('sleeping')
    expect(await instanceStatus()).toBe('sleeping')
  })

  it('wakes nothing for a request or a wakeup without the key', async () => {
    const before = await traffic()
    // Before anything would hold the request for the wake: no key, or a wrong one.
    expectRefused(await r.post('/v1/chat/completions', chat(GW)), 'missing_api_key')
    expectRefused(await r.post('/v1/chat/completions', chat(GW), bearer('wrong')), 'invalid_api_key')
    const service = r.host.api<RouterService>('router')
    expectRefused(await r.post(`/action/wakeup/${GW}`), 'missing_api_key')

    const entry = service.table.get(GW)!
    expect(entry.wakePromise).toBeNull()
    expect(entry.op).toBeNull()
    expect((await routerState())?.status).toBe('sleeping')
    expect(await instanceStatus()).toBe('sleeping')
    const after = await traffic()
    expect(after).toMatchObject({
      total_requests: before.total_requests,
      failed_requests: before.failed_requests,
      last_activity: before.last_activity,
    })

    const woke = await r.post(`/action/wakeup/${GW}`, {}, bearer(KEY))
    expect(woke.status).toBe(200)
    expect(woke.body).toMatchObject({ status: 'success', model: GW })
    expect(await instanceStatus()).toBe('active')
    expect(await engineRequests()).toBe(1)
  })

  it('keeps the no-auth default for a standalone endpoint model', async () => {
    const res = await r.post<{ model: string }>('/v1/chat/completions', chat(SOLO))
    expect(res.status).toBe(200)
    expect(res.body.model).toBe(SOLO)
    // An OpenAI client's key, right or wrong, is ignored as the spec says.
    expect((await r.post('/v1/chat/completions', chat(SOLO), bearer('anything'))).status).toBe(200)
    await waitFor('engine log lines', () => engineHits(solo, 'POST', '/v1/chat/completions') === 2, {
      timeoutMs: 5_000,
    })
    expect((await r.post(`/action/sleep/${SOLO}`)).status).toBe(200)
    expect((await routerState(SOLO))?.status).toBe('sleeping')
    expect((await r.post(`/action/wakeup/${SOLO}`)).status).toBe(200)
    expect((await routerState(SOLO))?.status).toBe('active')
  })

  // Whether a request needs the key depends on its model, which only the body names: a request that
  // shows no key is judged by its head as far as it can be. Its body gets the small limit of a
  // request nobody vouched for (server.max_admin_body_bytes, 16 MiB), refused from the head alone;
  // with the key it gets an inference body's.
  it('gives a request without the key the small body limit of an anonymous request, from its head', async () => {
    const port = Number(new URL(r.routerUrl).port)
    const big = 20 * 1024 * 1024
    const c = await NetRaw.open(port)
    c.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: ${big}\r\n\r\n`)
    await c.waitFor((x) => parse(x.text).length === 1, 5000, 'the 413')
    expect(parse(c.text)[0]!.status).toBe(413)
    c.socket.destroy()
    // With the key, the same head is taken (the body is awaited, not refused).
    const keyed = await NetRaw.open(port)
    keyed.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: ${big}\r\n\r\n{`,
    )
    await waitFor('the keyed body to be held', () => r.host.fronts.router!.bufferedBodyBytes >= big)
    expect(keyed.text).toBe('')
    keyed.socket.destroy()
  })
})

describe('router honours the gateway’s inference keys and their limits', () => {
  const send = (model: string, key: string) =>
    fetch(`${r.routerUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...bearer(key) },
      body: JSON.stringify(chat(model)),
    })
  const create = async (fields: Record<string, unknown>) =>
    (await admin<{ id: string; key: string }>('/api/keys', { method: 'POST', body: JSON.stringify(fields) }))
      .body

  it('holds a key to its rpm and model list on the router’s listener, with the same lines, and counts its usage', async () => {
    if ((await instanceStatus()) !== 'active') await r.post(`/action/wakeup/${GW}`, {}, bearer(KEY))
    const k = await create({ name: 'router-key', rpm: 2, models: [GW] })
    const first = await send(GW, k.key)
    expect(first.status).toBe(200)
    expect(first.headers.get('x-ratelimit-limit-requests')).toBe('2')
    expect(first.headers.get('x-ratelimit-remaining-requests')).toBe('1')
    await first.text()
    expect((await send(GW, k.key)).status).toBe(200)
    const limited = await send(GW, k.key)
    expect(limited.status).toBe(429)
    expect(((await limited.json()) as ErrorBody).error.code).toBe('rate_limit_exceeded')
    expect(limited.headers.get('retry-after')).toBe('30')
    // A key for another model may not use this one; the static key still may.
    const other = await create({ name: 'router-other', models: ['elsewhere'] })
    const denied = await send(GW, other.key)
    expect(denied.status).toBe(403)
    expect(((await denied.json()) as ErrorBody).error.code).toBe('model_not_allowed')
    expect((await send(GW, KEY)).status).toBe(200)
    const usage = await admin<{ rows: { model: string; requests: number; completion_tokens: number }[] }>(
      `/api/keys/${k.id}/usage`,
    )
    // The 429 is counted once, as a refused request of the key, under its reason.
    expect(usage.body.rows).toEqual([
      expect.objectContaining({ model: '(refused: requests)', requests: 1, completion_tokens: 0 }),
      expect.objectContaining({ model: GW, requests: 2 }),
    ])
    expect(usage.body.rows[1]!.completion_tokens).toBeGreaterThan(0)
  })

  it('leaves a standalone endpoint model to its no-auth default: no key needed, none counted', async () => {
    const k = await create({ name: 'router-solo', rpm: 1 })
    for (let i = 0; i < 3; i++) expect((await send(SOLO, k.key)).status).toBe(200)
    const usage = await admin<{ rows: unknown[] }>(`/api/keys/${k.id}/usage`)
    expect(usage.body.rows).toEqual([])
  })
})
