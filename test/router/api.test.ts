import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import { chat, startTwoAndGhost, type TestRouter, TWO_AND_GHOST } from './support.ts'

/**
 * The router alone (no gateway plugin), as the spec's standalone controller, in front of two
 * simulator engines and one endpoint where nothing listens: every endpoint with its exact shape,
 * the error shape and traffic statistics after a known sequence (actions: actions.test.ts).
 */
const { A, B, GHOST } = TWO_AND_GHOST
const enc = encodeURIComponent

let a: EngineProc
let b: EngineProc
let ghostPort: number
let r: TestRouter

const ISO = expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)

beforeAll(async () => {
  ;({ a, b, ghostPort, r } = await startTwoAndGhost())
})

afterAll(async () => {
  await r?.stop()
  await cleanupSims()
})

const streamChat = async (model: string) => {
  const res = await fetch(`${r.routerUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(chat(model, { stream: true })),
  })
  return { status: res.status, text: await res.text() }
}

describe('router traffic statistics after a known sequence', () => {
  it('counts every request that named a known model when its response ended', async () => {
    expect((await r.post('/v1/chat/completions', chat(A))).status).toBe(200)
    const s = await streamChat(A)
    expect(s.status).toBe(200)
    expect(s.text.trimEnd().endsWith('data: [DONE]')).toBe(true)
    expect((await r.post('/v1/completions', { model: B, prompt: 'Hello', max_tokens: 3 })).status).toBe(200)
    const bad = await r.post('/v1/chat/completions', chat(A, { max_tokens: 0 }))
    expect(bad.status).toBe(400)
    expect(bad.body).toEqual({
      error: {
        message: "'max_tokens' must be a positive integer (got 0)",
        type: 'invalid_request',
        code: 'invalid_parameter',
      },
    })
    const engineError = await r.post('/v1/chat/completions', { model: B, messages: [] })
    expect(engineError.status).toBe(400) // the engine's own answer, passed through
    const ghost = await r.post('/v1/chat/completions', chat(GHOST))
    expect(ghost.status).toBe(502)
    expect((ghost.body as { error: { code: string } }).error.code).toBe('upstream_unavailable')
    const unknown = await r.post('/v1/chat/completions', chat('nope'))
    expect(unknown.status).toBe(404)
    expect(unknown.body).toEqual({
      error: { message: "Model 'nope' is not configured", type: 'not_found', code: 'model_not_found' },
    })

    const stats = await r.get<{
      overall: Record<string, number>
      by_model: Record<string, Record<string, unknown>>
    }>('/traffic/stats')
    expect(stats.status).toBe(200)
    expect(Object.keys(stats.body).sort()).toEqual(['by_model', 'overall'])
    expect(stats.body.overall).toEqual({
      total_requests: 6,
      successful_requests: 3,
      failed_requests: 3,
      request_rate: expect.any(Number),
      avg_response_time: expect.any(Number),
    })
    expect(stats.body.overall.request_rate).toBeGreaterThan(0)
    expect(stats.body.overall.avg_response_time).toBeGreaterThan(0)
    expect(stats.body.by_model[A]).toEqual({
      total_requests: 3,
      successful_requests: 2,
      failed_requests: 1,
      request_rate: expect.any(Number),
      avg_response_time: expect.any(Number),
      last_activity: ISO,
    })
    expect(stats.body.by_model[B]).toMatchObject({
      total_requests: 2,
      successful_requests: 1,
      failed_requests: 1,
    })
    expect(stats.body.by_model[GHOST]).toMatchObject({
      total_requests: 1,
      successful_requests: 0,
      failed_requests: 1,
    })

    const one = await r.get(`/traffic/stats/${enc(A)}`)
    expect(one.body).toEqual({
      model: A,
      total_requests: 3,
      successful_requests: 2,
      failed_requests: 1,
      request_rate: expect.any(Number),
      avg_response_time: expect.any(Number),
      last_activity: ISO,
      idle_time: expect.any(Number),
    })
  })

  it('limits statistics to a window', async () => {
    r.clock.advance(2500)
    expect((await r.post('/v1/chat/completions', chat(B))).status).toBe(200)
    const w = await r.get<{
      overall: Record<string, number>
      by_model: Record<string, Record<string, number>>
    }>('/traffic/stats?window=1')
    expect(w.body.overall).toMatchObject({ total_requests: 1, successful_requests: 1, failed_requests: 0 })
    expect(w.body.overall.request_rate).toBe(60)
    expect(w.body.by_model[A]).toMatchObject({ total_requests: 0, avg_response_time: 0 })
    expect(w.body.by_model[B]).toMatchObject({ total_requests: 1 })
    const all = await r.get<{ overall: Record<string, number> }>('/traffic/stats')
    expect(all.body.overall).toMatchObject({ total_requests: 7, successful_requests: 4, failed_requests: 3 })
    const b1 = await r.get(`/traffic/stats/${B}?window=1`)
    expect(b1.body).toMatchObject({ model: B, total_requests: 1, successful_requests: 1 })
  })

  it('lists active and idle models', async () => {
    const active = await r.get<{ active_models: Record<string, unknown>[]; threshold: number }>(
      '/models/active?threshold=2&window=1',
    )
    expect(active.body.threshold).toBe(2)
    expect(active.body.active_models).toEqual([
      { model: B, last_activity: ISO, seconds_since_activity: expect.any(Number), request_count: 1 },
    ])
    const wide = await r.get<{ active_models: { model: string; request_count: number }[] }>(
      '/models/active?threshold=60&window=3600',
    )
    expect(wide.body.active_models.map((m) => [m.model, m.request_count])).toEqual([
      [A, 3],
      [B, 3],
      [GHOST, 1],
    ])
    const idle = await r.get<{ idle_models: Record<string, unknown>[]; threshold: number }>(
      '/models/idle?threshold=2',
    )
    expect(idle.body.threshold).toBe(2)
    expect(idle.body.idle_models).toEqual([
      { model: A, idle_time: expect.any(Number), last_activity: ISO },
      { model: GHOST, idle_time: expect.any(Number), last_activity: ISO },
    ])
    expect((idle.body.idle_models[0]!.idle_time as number) >= 2).toBe(true)
    expect((await r.get('/models/idle')).body).toEqual({ idle_models: [], threshold: 300 })
  })
})

describe('router models, health and server info', () => {
  it('lists configured models with their endpoints', async () => {
    const res = await r.get<{ object: string; data: Record<string, unknown>[] }>('/models')
    expect(res.status).toBe(200)
    const created = expect.any(Number)
    expect(res.body).toEqual({
      object: 'list',
      data: [
        {
          id: A,
          object: 'model',
          created,
          owned_by: 'modelgate',
          endpoint: { host: '127.0.0.1', port: a.port },
        },
        {
          id: B,
          object: 'model',
          created,
          owned_by: 'modelgate',
          endpoint: { host: '127.0.0.1', port: b.port },
        },
        {
          id: GHOST,
          object: 'model',
          created,
          owned_by: 'modelgate',
          endpoint: { host: '127.0.0.1', port: ghostPort },
        },
      ],
    })
    expect(Number.isInteger(res.body.data[0]!.created)).toBe(true)
    expect((await r.get('/v1/models')).body).toEqual(res.body)
  })

  it('reports its health and version', async () => {
    expect((await r.get('/health')).body).toEqual({
      status: 'healthy',
      timestamp: ISO,
      uptime: expect.any(Number),
      models_active: 3,
      models_sleeping: 0,
    })
    expect((await r.get('/get_server_info')).body).toEqual({
      version: '0.0.0-test',
      controller: 'modelgate-router',
    })
  })

  it("probes a model's engine health", async () => {
    expect((await r.get(`/health/${enc(A)}`)).body).toEqual({
      model: A,
      status: 'healthy',
      endpoint: { host: '127.0.0.1', port: a.port },
      response_time: expect.any(Number),
    })
    const ghost = await r.get(`/health/${GHOST}`)
    expect(ghost.status).toBe(200)
    expect(ghost.body).toEqual({
      model: GHOST,
      status: 'unhealthy',
      endpoint: { host: '127.0.0.1', port: ghostPort },
      error: expect.any(String),
    })
    const unknown = await r.get('/health/nope')
    expect(unknown.status).toBe(404)
    expect(unknown.body).toEqual({
      error: { message: "Model 'nope' is not configured", type: 'not_found', code: 'model_not_found' },
    })
  })
})

describe('router errors and docs', () => {
  it('renders every error in the one error shape', async () => {
    const cases: [string, Promise<{ status: number; body: unknown }>, number, string][] = [
      ['bad json', r.post('/v1/chat/completions', '{"model":'), 400, 'invalid_json'],
      ['no model', r.post('/v1/completions', { prompt: 'x' }), 400, 'invalid_parameter'],
      [
        'max_tokens text',
        r.post('/v1/completions', { model: B, prompt: 'x', max_tokens: '5' }),
        400,
        'invalid_parameter',
      ],
      ['threshold', r.get('/models/idle?threshold=abc'), 400, 'invalid_parameter'],
      ['threshold 0', r.get('/models/active?threshold=0'), 400, 'invalid_parameter'],
      ['window', r.get('/models/active?window=1.5'), 400, 'invalid_parameter'],
      ['window -1', r.get('/traffic/stats?window=-1'), 400, 'invalid_parameter'],
      ['stats of unknown', r.get('/traffic/stats/nope'), 404, 'model_not_found'],
      ['unknown route', r.get('/nope'), 404, 'not_found'],
    ]
    for (const [what, p, status, code] of cases) {
      const res = await p
      expect({ what, status: res.status }).toEqual({ what, status })
      expect(res.body).toEqual({ error: { message: expect.any(String), type: expect.any(String), code } })
    }
  })

  it('serves its own docs listing every route', async () => {
    const doc = await r.get<{ info: { title: string }; paths: Record<string, Record<string, unknown>> }>(
      '/docs/json',
    )
    expect(doc.body.info.title).toBe('modelgate router')
    expect(Object.keys(doc.body.paths).sort()).toEqual(
      [
        '/action/sleep/{model_name}',
        '/action/wakeup/{model_name}',
        '/get_server_info',
        '/health',
        '/health/{model_name}',
        '/models',
        '/models/active',
        '/models/idle',
        '/sleep/candidates',
        '/sleep/status',
        '/traffic/stats',
        '/traffic/stats/{model_name}',
        '/v1/chat/completions',
        '/v1/completions',
        '/v1/messages',
        '/v1/models',
        '/v1/responses',
      ].sort(),
    )
    const chatDoc = doc.body.paths['/v1/chat/completions']!.post as { requestBody: unknown }
    expect(chatDoc.requestBody).toBeDefined()
    const idleDoc = doc.body.paths['/models/idle']!.get as { parameters: Record<string, unknown>[] }
    expect(idleDoc.parameters).toEqual([
      expect.objectContaining({
        name: 'threshold',
        in: 'query',
        schema: { type: 'integer', minimum: 1, default: 300 },
      }),
    ])
    const html = await fetch(`${r.routerUrl}/docs`)
    expect(html.status).toBe(200)
    expect(html.headers.get('content-type')).toContain('text/html')
  })
})
