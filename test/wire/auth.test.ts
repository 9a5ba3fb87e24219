import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import {
  errorOf,
  FakeGateway,
  instance,
  type ProxyHost,
  type Stub,
  startProxyHost,
  startStub,
} from './support.ts'

const SECRET = 's'.repeat(40)
const chatBody = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] })

/** The inference routes, all served as raw routes before Elysia: the host must guard them too. */
const routes = (stubPort: number): [string, string, string | undefined][] => [
  ['POST', '/v1/chat/completions', chatBody],
  ['POST', '/tokenize', JSON.stringify({ model: 'm', prompt: 'hi' })],
  ['GET', '/v1/models', undefined],
  ['GET', `/api/direct/${stubPort}/v1/models`, undefined],
]

describe('inference API key', () => {
  const api = new FakeGateway()
  let stub: Stub
  let keyed: ProxyHost
  let open: ProxyHost
  let adminJwt: string

  beforeAll(async () => {
    stub = startStub((_req, seen) => Response.json({ ok: true, path: seen.path }))
    api.add(instance('m', stub.port))
    keyed = await startProxyHost(api, {
      env: { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw', JWT_SECRET: SECRET, INFERENCE_API_KEY: 'sk-test' },
    })
    open = await startProxyHost(api)
    const login = await fetch(`${keyed.url}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'admin', password: 'pw' }),
    })
    adminJwt = ((await login.json()) as { token: string }).token
  })
  afterAll(async () => {
    await keyed.stop()
    await open.stop()
    stub.stop()
  })

  const call = (base: string, method: string, path: string, body: string | undefined, auth?: string) =>
    fetch(`${base}${path}`, { method, body, headers: auth ? { authorization: auth } : {} })

  it('refuses a missing key with 401 missing_api_key on every inference route', async () => {
    for (const [method, path, body] of routes(stub.port)) {
      const before = stub.seen.length
      const res = await call(keyed.url, method, path, body)
      expect(res.status, path).toBe(401)
      expect(await errorOf(res)).toEqual({
        message: 'Missing API key: send Authorization: Bearer <API_KEY>',
        type: 'authentication_error',
        code: 'missing_api_key',
      })
      expect(stub.seen.length, `${path} must not reach the engine`).toBe(before)
    }
  })

  it('refuses a wrong key with 401 invalid_api_key', async () => {
    for (const [method, path, body] of routes(stub.port)) {
      const res = await call(keyed.url, method, path, body, 'Bearer sk-wrong')
      expect(res.status, path).toBe(401)
      expect((await errorOf(res)).code).toBe('invalid_api_key')
    }
  })

  it('does not accept the admin JWT as an inference key', async () => {
    expect(adminJwt.split('.')).toHaveLength(3)
    for (const [method, path, body] of routes(stub.port)) {
      const res = await call(keyed.url, method, path, body, `Bearer ${adminJwt}`)
      expect(res.status, path).toBe(401)
      expect((await errorOf(res)).code).toBe('invalid_api_key')
    }
  })

  it('serves the right key', async () => {
    for (const [method, path, body] of routes(stub.port)) {
      const res = await call(keyed.url, method, path, body, 'Bearer sk-test')
      expect(res.status, path).toBe(200)
    }
  })

  it('leaves inference open when INFERENCE_API_KEY is unset, with or without a bearer', async () => {
    for (const [method, path, body] of routes(stub.port)) {
      expect((await call(open.url, method, path, body)).status, path).toBe(200)
      expect((await call(open.url, method, path, body, 'Bearer anything')).status, path).toBe(200)
    }
  })
})
