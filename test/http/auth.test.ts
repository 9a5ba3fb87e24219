import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { createHmac, randomUUID } from 'node:crypto'
import { Type as T } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import { categorize } from '../../src/http/auth.ts'
import { startHost, type TestHost } from '../support/host.ts'

const SECRET = 's'.repeat(40)

/** probe is a plugin with one admin read, one admin write, one event stream and one inference route. */
const probe = definePlugin({
  id: 'probe',
  description: 'test routes',
  config: T.Object({}, { additionalProperties: false }),
  setup: () => ({
    routes: new Elysia()
      .get('/api/models/things', () => ({ ok: true }))
      .post('/api/models/things', () => ({ created: true }))
      .get('/api/models/things/events', () => ({ stream: true }))
      .post('/v1/echo', () => ({ echoed: true })),
  }),
}) as unknown as PluginDefinition

function b64(o: unknown): string {
  return Buffer.from(JSON.stringify(o)).toString('base64url')
}

function forge(
  header: Record<string, unknown>,
  payload: Record<string, unknown>,
  secret = SECRET,
  hash = 'sha256',
) {
  const head = `${b64(header)}.${b64(payload)}`
  if (header.alg === 'none') return `${head}.`
  return `${head}.${createHmac(hash, secret).update(head).digest('base64url')}`
}

const now = () => Math.floor(Date.now() / 1000)
/** The default lifetime (auth.jwt_ttl_seconds). */
const TTL = 43200
/** claims: what modelgate issues (iss, aud, iat, exp, jti...), changed by `extra` (undefined drops a claim). */
const claims = (extra: Record<string, unknown> = {}) => ({
  iss: 'modelgate',
  aud: 'modelgate-admin',
  jti: randomUUID(),
  sub: 'admin',
  username: 'admin',
  roles: ['admin'],
  authMode: 'simple',
  iat: now(),
  exp: now() + 600,
  ...extra,
})

async function errorOf(res: Response) {
  return ((await res.json()) as { error: Record<string, unknown> }).error
}

describe('route categories', () => {
  it('sorts paths as the spec says', () => {
    expect(categorize('/api/health/ready')).toBe('public')
    expect(categorize('/api/auth/login')).toBe('public')
    expect(categorize('/docs/json')).toBe('public')
    expect(categorize('/metrics')).toBe('public')
    expect(categorize('/api/v1/models')).toBe('admin')
    expect(categorize('/api/v1/metrics')).toBe('admin')
    expect(categorize('/api/gpu/available')).toBe('admin')
    expect(categorize('/v1/chat/completions')).toBe('inference')
    expect(categorize('/api/direct/8001/health')).toBe('inference')
    expect(categorize('/tokenize')).toBe('inference')
    expect(categorize('/re-rank')).toBe('inference')
    expect(categorize('/internal/ping')).toBe('internal')
  })
})

describe('auth in simple mode', () => {
  let th: TestHost
  beforeAll(async () => {
    th = await startHost('plugins:\n  probe: {}\n', [probe], {
      AUTH_MODE: 'simple',
      ADMIN_PASSWORD: 'hunter2',
      JWT_SECRET: SECRET,
      INFERENCE_API_KEY: 'sk-test',
    })
  })
  afterAll(() => th.stop())

  const get = (path: string, token?: string) =>
    fetch(`${th.url}${path}`, { headers: token ? { authorization: `Bearer ${token}` } : {} })

  it('logs in and uses the token on admin routes', async () => {
    const res = await fetch(`${th.url}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'admin', password: 'hunter2' }),
    })
    expect(res.status).toBe(200)
    const body = (await res.json()) as { token: string; expires_in: number }
    expect(body.expires_in).toBe(TTL)
    const [, payload] = body.token.split('.')
    const decoded = JSON.parse(Buffer.from(payload!, 'base64url').toString())
    expect(decoded).toMatchObject({
      iss: 'modelgate',
      aud: 'modelgate-admin',
      sub: 'admin',
      username: 'admin',
      roles: ['admin'],
      authMode: 'simple',
    })
    expect(decoded.jti).toMatch(/^[0-9a-f-]{36}$/)
    expect(decoded.exp - decoded.iat).toBe(TTL)
    expect((await get('/api/models/things', body.token)).status).toBe(200)
    const me = await get('/api/auth/me', body.token)
    expect(await me.json()).toMatchObject({ username: 'admin', roles: ['admin'] })
  })

  it('refuses a wrong password with 401 in the controller shape', async () => {
    const res = await fetch(`${th.url}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'admin', password: 'nope' }),
    })
    expect(res.status).toBe(401)
    expect(await errorOf(res)).toEqual({
      code: 'UNAUTHORIZED',
      message: 'Invalid username or password',
      statusCode: 401,
    })
  })

  it('refuses a missing token', async () => {
    const res = await get('/api/models/things')
    expect(res.status).toBe(401)
    expect((await errorOf(res)).code).toBe('UNAUTHORIZED')
  })

  it.each([
    ['alg=none', () => forge({ alg: 'none', typ: 'JWT' }, claims())],
    ['HS512 with the same secret', () => forge({ alg: 'HS512', typ: 'JWT' }, claims(), SECRET, 'sha512')],
    ['a wrong signature', () => forge({ alg: 'HS256', typ: 'JWT' }, claims(), 'w'.repeat(40))],
    ['a missing exp', () => forge({ alg: 'HS256', typ: 'JWT' }, claims({ exp: undefined }))],
    [
      'an expired token',
      () => forge({ alg: 'HS256', typ: 'JWT' }, claims({ exp: now() - 10, iat: now() - 100 })),
    ],
    ['garbage', () => 'not.a.jwt'],
  ])('rejects %s with 401', async (_name, make) => {
    const res = await get('/api/models/things', make())
    expect(res.status).toBe(401)
    expect(await errorOf(res)).toMatchObject({ code: 'UNAUTHORIZED', statusCode: 401 })
  })

  const HS256 = { alg: 'HS256', typ: 'JWT' }
  it.each([
    ['an exp of 10^13', () => claims({ exp: 10 ** 13 }), /lifetime is longer/],
    ['a lifetime one second longer than jwt_ttl_seconds', () => claims({ exp: now() + TTL + 1 }), /lifetime/],
    ['an iat an hour in the future', () => claims({ iat: now() + 3600, exp: now() + 3600 + 600 }), /future/],
    ['a missing iat', () => claims({ iat: undefined }), /missing claims/],
    ['a missing jti', () => claims({ jti: undefined }), /missing claims/],
    ['another issuer', () => claims({ iss: 'someone-else' }), /issuer must be "modelgate"/],
    ['no issuer', () => claims({ iss: undefined }), /issuer must be "modelgate"/],
    ['another audience', () => claims({ aud: 'modelgate-inference' }), /audience must be "modelgate-admin"/],
    ['no audience', () => claims({ aud: undefined }), /audience must be "modelgate-admin"/],
    ['an audience list', () => claims({ aud: ['modelgate-admin', 'x'] }), /audience/],
  ])('rejects a token signed with the secret but with %s (401 naming why)', async (_name, make, why) => {
    const res = await get('/api/models/things', forge(HS256, make()))
    expect(res.status).toBe(401)
    const error = await errorOf(res)
    expect(error).toMatchObject({ code: 'UNAUTHORIZED', statusCode: 401 })
    expect(String(error.message)).toMatch(why)
  })

  it('accepts the longest lifetime it issues and an iat within the clock skew', async () => {
    expect((await get('/api/models/things', forge(HS256, claims({ exp: now() + TTL })))).status).toBe(200)
    const skewed = claims({ iat: now() + 30, exp: now() + 30 + 600 })
    expect((await get('/api/models/things', forge(HS256, skewed))).status).toBe(200)
  })

  it('accepts a well-formed HS256 token it did not issue through login (same secret)', async () => {
    expect((await get('/api/models/things', forge({ alg: 'HS256', typ: 'JWT' }, claims()))).status).toBe(200)
  })

  it('lets admin-readonly read but not write (403 naming the role)', async () => {
    const token = forge({ alg: 'HS256', typ: 'JWT' }, claims({ roles: ['admin-readonly'] }))
    expect((await get('/api/models/things', token)).status).toBe(200)
    const res = await fetch(`${th.url}/api/models/things`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}` },
    })
    expect(res.status).toBe(403)
    expect((await errorOf(res)).message).toContain("'admin'")
  })

  it('accepts the token as a query parameter on event streams only, and keeps it out of logs', async () => {
    const token = forge({ alg: 'HS256', typ: 'JWT' }, claims())
    expect((await get(`/api/models/things/events?token=${token}`)).status).toBe(200)
    expect((await get(`/api/models/things?token=${token}`)).status).toBe(401)
    expect(th.logs.join('\n')).not.toContain(token)
  })

  it('revokes the token on logout', async () => {
    const login = await fetch(`${th.url}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'admin', password: 'hunter2' }),
    })
    const { token } = (await login.json()) as { token: string }
    const out = await fetch(`${th.url}/api/auth/logout`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}` },
    })
    expect(out.status).toBe(200)
    expect((await get('/api/models/things', token)).status).toBe(401)
  })

  it('keeps health, auth info and docs public', async () => {
    expect((await get('/api/health')).status).toBe(200)
    expect((await get('/api/auth/info')).status).toBe(200)
    expect(await (await get('/api/auth/info')).json()).toMatchObject({ mode: 'simple', auth_enabled: true })
    expect((await get('/docs/json')).status).toBe(200)
  })

  it('guards inference with the API key in the proxy shape, and not with the admin JWT', async () => {
    const post = (auth?: string) =>
      fetch(`${th.url}/v1/echo`, { method: 'POST', headers: auth ? { authorization: auth } : {} })
    const missing = await post()
    expect(missing.status).toBe(401)
    expect(await errorOf(missing)).toEqual({
      message: 'Missing API key: send Authorization: Bearer <API_KEY>',
      type: 'authentication_error',
      code: 'missing_api_key',
    })
    const wrong = await post('Bearer sk-wrong')
    expect(wrong.status).toBe(401)
    expect((await errorOf(wrong)).code).toBe('invalid_api_key')
    const jwt = await post(`Bearer ${forge({ alg: 'HS256', typ: 'JWT' }, claims())}`)
    expect(jwt.status).toBe(401)
    expect((await post('Bearer sk-test')).status).toBe(200)
  })
})

describe('logout across a restart', () => {
  const env = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'hunter2', JWT_SECRET: SECRET }
  const login = async (url: string) => {
    const res = await fetch(`${url}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'admin', password: 'hunter2' }),
    })
    return ((await res.json()) as { token: string }).token
  }
  const me = (url: string, token: string) =>
    fetch(`${url}/api/auth/me`, { headers: { authorization: `Bearer ${token}` } })

  it('still refuses a logged-out token after the host restarts on the same data dir', async () => {
    const first = await startHost('plugins:\n  probe: {}\n', [probe], env)
    let second: TestHost | null = null
    try {
      const [out, kept] = [await login(first.url), await login(first.url)]
      const logout = await fetch(`${first.url}/api/auth/logout`, {
        method: 'POST',
        headers: { authorization: `Bearer ${out}` },
      })
      expect(logout.status).toBe(200)
      await first.stopKeep()
      second = await startHost('plugins:\n  probe: {}\n', [probe], env, first.dataDir)
      const refused = await me(second.url, out)
      expect(refused.status).toBe(401)
      expect(await errorOf(refused)).toMatchObject({
        code: 'UNAUTHORIZED',
        message: 'Token has been revoked',
      })
      // The other token of the same user was not logged out: it still works.
      expect((await me(second.url, kept)).status).toBe(200)
    } finally {
      await (second ?? first).stop()
    }
  })
})

describe('auth in none mode', () => {
  let th: TestHost
  beforeAll(async () => {
    th = await startHost('plugins:\n  probe: {}\n', [probe])
  })
  afterAll(() => th.stop())

  it('lets everyone act as admin and leaves inference open', async () => {
    expect((await fetch(`${th.url}/api/models/things`, { method: 'POST' })).status).toBe(200)
    expect((await fetch(`${th.url}/v1/echo`, { method: 'POST' })).status).toBe(200)
    expect(await (await fetch(`${th.url}/api/auth/me`)).json()).toMatchObject({
      roles: ['admin'],
      authMode: 'none',
    })
  })

  it('refuses login when auth is disabled', async () => {
    const res = await fetch(`${th.url}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'a', password: 'b' }),
    })
    expect(res.status).toBe(400)
    expect((await errorOf(res)).code).toBe('LOGIN_NOT_AVAILABLE')
  })
})

describe('required roles', () => {
  it('lets admin-readonly read and run the memory pre-load check, and nothing else', async () => {
    const { accessOf, requiredRole } = await import('../../src/http/auth.ts')
    const role = (method: string, path: string, detail?: object) =>
      requiredRole(accessOf({ method, path, hooks: { detail } }))
    expect(role('GET', '/api/v1/models')).toBe('admin-readonly')
    expect(role('HEAD', '/api/v1/models')).toBe('admin-readonly')
    expect(role('POST', '/api/memory/profiles/check', { 'x-read-only': true })).toBe('admin-readonly')
    expect(role('POST', '/api/memory/profiles')).toBe('admin')
    expect(role('DELETE', '/api/memory/profiles/:id')).toBe('admin')
  })

  it("takes x-required-role: 'admin' keeps a read for admins, 'admin-readonly' opens a POST", async () => {
    const { accessOf, requiredRole } = await import('../../src/http/auth.ts')
    const role = (method: string, path: string, detail?: object) =>
      requiredRole(accessOf({ method, path, hooks: { detail } }))
    expect(role('GET', '/api/orphans', { 'x-required-role': 'admin' })).toBe('admin')
    expect(role('HEAD', '/api/orphans', { 'x-required-role': 'admin' })).toBe('admin')
    expect(role('POST', '/api/memory/profiles', { 'x-required-role': 'admin-readonly' })).toBe(
      'admin-readonly',
    )
    expect(role('DELETE', '/api/x/:id', { 'x-required-role': 'admin' })).toBe('admin')
  })

  it.each([
    ['an unknown role', { 'x-required-role': 'root' }, "x-required-role must be 'admin' or 'admin-readonly'"],
    ['a contradiction', { 'x-read-only': true, 'x-required-role': 'admin' }, 'contradict'],
    ['a non-boolean x-read-only', { 'x-read-only': 'yes' }, 'x-read-only must be a boolean'],
    ['a role on a public route', { 'x-auth': 'public', 'x-required-role': 'admin' }, 'admin routes only'],
  ])('refuses %s when the routes are declared', async (_name, detail, message) => {
    const { accessOf } = await import('../../src/http/auth.ts')
    expect(() => accessOf({ method: 'GET', path: '/api/things', hooks: { detail } })).toThrow(message)
  })
})

describe('an admin-only read, end to end', () => {
  const detail = { summary: 'An admin-only read', 'x-required-role': 'admin' }
  const secret = definePlugin({
    id: 'probe',
    description: 'test routes',
    config: T.Object({}, { additionalProperties: false }),
    setup: () => ({
      routes: new Elysia().get('/api/models/secrets', () => ({ ok: true }), {
        detail,
      }),
    }),
  }) as unknown as PluginDefinition
  let th: TestHost
  beforeAll(async () => {
    th = await startHost('plugins:\n  probe: {}\n', [secret], {
      AUTH_MODE: 'simple',
      ADMIN_PASSWORD: 'hunter2',
      JWT_SECRET: SECRET,
    })
  })
  afterAll(() => th.stop())

  it('refuses admin-readonly (403 naming admin), lets admin in, and says so in /docs/json', async () => {
    const as = async (roles: ('admin' | 'admin-readonly')[]) =>
      fetch(`${th.url}/api/models/secrets`, {
        headers: { authorization: `Bearer ${(await th.host.auth.issueToken('u', roles)).token}` },
      })
    const ro = await as(['admin-readonly'])
    expect(ro.status).toBe(403)
    expect((await errorOf(ro)).message).toContain("'admin'")
    expect((await as(['admin'])).status).toBe(200)
    const doc = (await (await fetch(`${th.url}/docs/json`)).json()) as {
      paths: Record<string, Record<string, Record<string, unknown>>>
    }
    expect(doc.paths['/api/models/secrets']?.get?.['x-required-role']).toBe('admin')
  })
})
