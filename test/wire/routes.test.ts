import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { ENGINE_PATHS } from '../../plugins/gateway/proxy/routes.ts'
import { waitFor } from '../support/wait.ts'
import {
  CHAT_REPLY,
  chatHandler,
  errorOf,
  FakeGateway,
  instance,
  type ProxyHost,
  postJson,
  type Stub,
  startProxyHost,
  startStub,
  streamFrames,
} from './support.ts'

describe('inference routes', () => {
  const api = new FakeGateway()
  let stub: Stub
  let px: ProxyHost

  beforeAll(async () => {
    stub = startStub(chatHandler(4, 5))
    api.add(instance('m', stub.port, { served_model_name: 'llama', model_path: 'meta/llama' }))
    api.add(instance('m2', stub.port, { served_model_name: 'llama', model_path: 'meta/llama' }))
    api.add(instance('w', stub.port, { status: 'starting' }))
    api.add(instance('z', stub.port, { status: 'sleeping' }))
    px = await startProxyHost(api)
  })
  afterAll(async () => {
    await px.stop()
    stub.stop()
  })

  it('lists every model a client may name once, with its state: active, loading, sleeping', async () => {
    const res = await fetch(`${px.url}/v1/models`)
    expect(res.status).toBe(200)
    const body = (await res.json()) as { object: string; data: Record<string, unknown>[] }
    expect(body.object).toBe('list')
    expect(body.data.map((d) => [d.id, d.state, d.instance_id])).toEqual([
      ['llama', 'active', 'm'],
      ['w-served', 'loading', 'w'],
      ['z-served', 'sleeping', 'z'],
    ])
    expect(body.data[0]).toEqual({
      id: 'llama',
      object: 'model',
      created: Date.parse('2026-01-01T00:00:10.000Z') / 1000,
      owned_by: 'modelgate',
      root: 'meta/llama',
      max_model_len: 4096,
      state: 'active',
      instance_id: 'm',
    })
  })

  it.each(Object.entries(ENGINE_PATHS))(
    'forwards %s to the engine path %s, body byte for byte',
    async (path, enginePath) => {
      // Odd spacing, key order and non-ASCII survive only if the bytes are never re-serialised.
      const raw = `{ "input": "héllo ✓",\n  "model" :"llama", "extra": [1, 2.50, {"k": null}] }`
      const res = await postJson(`${px.url}${path}?trace=1`, raw)
      expect(res.status).toBe(200)
      const seen = stub.seen.at(-1)!
      expect(seen.path).toBe(enginePath)
      expect(seen.query).toBe('?trace=1')
      expect(new TextDecoder().decode(seen.body)).toBe(raw)
    },
  )

  it('gives the engine its served name when the client names the instance by id or path', async () => {
    for (const model of ['m2', 'meta/llama']) {
      const res = await postJson(
        `${px.url}/v1/chat/completions`,
        `{"messages" : [ ], "model":"${model}" ,"x":1}`,
      )
      expect(res.status).toBe(200)
      expect(new TextDecoder().decode(stub.seen.at(-1)!.body)).toBe(
        '{"messages" : [ ], "model":"llama" ,"x":1}',
      )
    }
    expect(px.events.at(-1)).toMatchObject({ model: 'meta/llama' })
  })

  it('resolves a model by instance id, served name and model path', async () => {
    for (const model of ['m', 'llama', 'meta/llama']) {
      const res = await postJson(`${px.url}/v1/completions`, { model, prompt: 'x' })
      expect(res.status).toBe(200)
    }
  })

  it('is served on the exact path only: the documented Elysia route answers 404 to another spelling', async () => {
    const seen = stub.seen.length
    for (const path of ['/v1/chat/completions/', '/tokenize/']) {
      const res = await postJson(`${px.url}${path}`, { model: 'm', messages: [] })
      expect(res.status).toBe(404)
      expect(await errorOf(res)).toEqual({
        message: `No route for POST ${path}`,
        type: 'invalid_request_error',
        code: 'not_found',
      })
    }
    const models = await fetch(`${px.url}/v1/models/`)
    expect(models.status).toBe(404)
    expect(stub.seen.length).toBe(seen)
  })

  it('is served by the raw route, not by the documented Elysia route (no schema validation in between)', async () => {
    const res = await postJson(`${px.url}/v1/chat/completions`, { model: 'm', messages: 'not an array' })
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual(CHAT_REPLY)
  })

  it('counts proxied requests in the metrics and announces them on the bus', async () => {
    await postJson(`${px.url}/v1/chat/completions`, { model: 'm', messages: [] })
    const streamed = await postJson(`${px.url}/v1/chat/completions`, {
      model: 'm',
      stream: true,
      messages: [],
    })
    expect(await streamed.text()).toBe(streamFrames(4).join(''))
    await waitFor('leases released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
    const text = await (await fetch(`${px.url}/metrics`)).text()
    expect(text).toMatch(/^# TYPE modelgate_requests_total counter$/m)
    expect(text).toMatch(/^modelgate_requests_total\{model_id="m",status="200"\} \d+$/m)
    expect(text).toMatch(/^# TYPE modelgate_request_duration_ms histogram$/m)
    expect(text).toMatch(/^modelgate_request_duration_ms_bucket\{le="5",model_id="m"\} \d+$/m)
    expect(text).toMatch(/^modelgate_request_duration_ms_bucket\{le="600000",model_id="m"\} \d+$/m)
    expect(text).toMatch(/^modelgate_request_duration_ms_count\{model_id="m"\} \d+$/m)
    const [plain, stream] = px.events.slice(-2)
    expect(plain).toMatchObject({ model: 'm', instance_id: 'm', status: 200, streamed: false, ttft_ms: null })
    expect(stream).toMatchObject({
      model: 'm',
      instance_id: 'm',
      status: 200,
      streamed: true,
      path: '/v1/chat/completions',
    })
    expect(stream!.ttft_ms).toBeGreaterThan(0)
  })

  it('documents every inference route in /docs under the gateway tag', async () => {
    const doc = (await (await fetch(`${px.url}/docs/json`)).json()) as {
      paths: Record<
        string,
        Record<string, { tags?: string[]; requestBody?: unknown; responses?: Record<string, unknown> }>
      >
    }
    for (const path of Object.keys(ENGINE_PATHS)) {
      const op = doc.paths[path]?.post
      expect(op, path).toBeDefined()
      expect(op!.tags).toEqual(['gateway'])
      expect(op!.requestBody).toBeDefined()
      // The Messages API answers a full queue or a sleeping model 529, as Anthropic's API does.
      const statuses = path === '/v1/messages' ? ['529', '429', '404'] : ['503']
      expect(Object.keys(op!.responses ?? {})).toEqual(
        expect.arrayContaining(['200', '400', '401', '502', '504', ...statuses]),
      )
    }
    expect(doc.paths['/v1/models']?.get?.tags).toEqual(['gateway'])
    const direct = Object.keys(doc.paths).find((p) => p.startsWith('/api/direct/'))
    expect(direct).toBeDefined()
    expect(doc.paths[direct!]!.get?.tags).toEqual(['gateway'])
  })
})
