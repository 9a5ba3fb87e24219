import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { Type as T } from '@sinclair/typebox'
import { Elysia, t } from 'elysia'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import { AppError, proxyError } from '../../src/http/errors.ts'
import { startHost, type TestHost } from '../support/host.ts'

const probe = definePlugin({
  id: 'probe',
  description: 'test routes',
  config: T.Object({}, { additionalProperties: false }),
  setup: () => ({
    routes: new Elysia()
      .post('/api/models/load', ({ body }) => body, {
        body: t.Object({
          model_path: t.String({ minLength: 1 }),
          max_tokens: t.Optional(t.Integer({ minimum: 1 })),
        }),
      })
      .get('/api/models/lines', ({ query }) => query, {
        query: t.Object({ lines: t.Optional(t.Numeric({ minimum: 1, maximum: 500 })) }),
      })
      .get('/api/models/boom', () => {
        throw new Error('secret internals at /srv/app.ts:12')
      })
      .get('/api/models/conflict', () => {
        throw new AppError(409, 'MODEL_ALREADY_EXISTS', 'port 8001 is taken')
      })
      .post('/v1/thing', ({ body }) => body, { body: t.Object({ model: t.String() }) })
      .get('/v1/sleepy', () => {
        throw proxyError(503, 'service_unavailable', 'model_sleeping', 'asleep', undefined, {
          'retry-after': '5',
        })
      }),
  }),
}) as unknown as PluginDefinition

describe('error rendering', () => {
  let th: TestHost
  beforeAll(async () => {
    th = await startHost('plugins:\n  probe: {}\n', [probe])
  })
  afterAll(() => th.stop())

  const send = (method: string, path: string, body?: string) =>
    fetch(`${th.url}${path}`, { method, body, headers: body ? { 'content-type': 'application/json' } : {} })

  it('renders body validation errors in the controller shape naming the field', async () => {
    const res = await send('POST', '/api/models/load', JSON.stringify({ model_path: 'x', max_tokens: 0 }))
    expect(res.status).toBe(400)
    const body = (await res.json()) as { error: { code: string; message: string; statusCode: number } }
    expect(body.error.code).toBe('VALIDATION_ERROR')
    expect(body.error.statusCode).toBe(400)
    expect(body.error.message).toContain('max_tokens')
    expect(Object.keys(body)).toEqual(['error'])
    const missing = await send('POST', '/api/models/load', JSON.stringify({}))
    expect(((await missing.json()) as { error: { message: string } }).error.message).toContain('model_path')
  })

  it('renders a query validation error as 400', async () => {
    const res = await send('GET', '/api/models/lines?lines=9999')
    expect(res.status).toBe(400)
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('VALIDATION_ERROR')
  })

  it('renders malformed JSON as 400, not 500', async () => {
    const res = await send('POST', '/api/models/load', '{nope')
    expect(res.status).toBe(400)
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('VALIDATION_ERROR')
  })

  it('never leaks a stack trace on 500', async () => {
    const res = await send('GET', '/api/models/boom')
    expect(res.status).toBe(500)
    const text = await res.text()
    expect(JSON.parse(text)).toEqual({
      error: { code: 'INTERNAL_ERROR', message: 'Internal server error', statusCode: 500 },
    })
    expect(text).not.toContain('/srv/app.ts')
    expect(th.logs.join('\n')).toContain('secret internals')
  })

  it('passes AppErrors through with their status', async () => {
    const res = await send('GET', '/api/models/conflict')
    expect(res.status).toBe(409)
    expect(await res.json()).toEqual({
      error: { code: 'MODEL_ALREADY_EXISTS', message: 'port 8001 is taken', statusCode: 409 },
    })
  })

  it('renders unknown routes as 404 in the controller shape, and in the proxy shape under /v1', async () => {
    const res = await send('GET', '/api/nothing/here')
    expect(res.status).toBe(404)
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('NOT_FOUND')
    const v1 = await send('GET', '/v1/nothing')
    expect(v1.status).toBe(404)
    expect(((await v1.json()) as { error: { type: string } }).error.type).toBe('invalid_request_error')
  })

  it('uses the proxy shape for inference validation errors and keeps extra headers', async () => {
    const res = await send('POST', '/v1/thing', JSON.stringify({}))
    expect(res.status).toBe(400)
    const body = (await res.json()) as { error: Record<string, string> }
    expect(body.error.type).toBe('invalid_request_error')
    expect(body.error.statusCode).toBeUndefined()
    const sleepy = await send('GET', '/v1/sleepy')
    expect(sleepy.status).toBe(503)
    expect(sleepy.headers.get('retry-after')).toBe('5')
    expect(await sleepy.json()).toEqual({
      error: { message: 'asleep', type: 'service_unavailable', code: 'model_sleeping' },
    })
  })
})
