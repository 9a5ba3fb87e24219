import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { rmSync } from 'node:fs'
import { Type as T } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import { Events } from 'oauth2-mock-server'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import { OAuthFlow, oauthProblems, oauthSettings, STATE_COOKIE } from '../../src/http/oauth.ts'
import { UsedStates } from '../../src/http/oauth-states.ts'
import { CORE_OWNER, coreMigrations } from '../../src/store/core/migrations.ts'
import { applyMigrations, openStore, type Store } from '../../src/store/db.ts'
import { startHost, type TestHost, tempDataDir } from '../support/host.ts'
import {
  Browser,
  claimsOf,
  fragmentOf,
  type Platform,
  type Provider,
  startPlatform,
  startProvider,
} from '../support/oauth.ts'

/**
 * OAuth mode end to end, over real sockets: the gateway (a real Host), a real OAuth 2 provider
 * (oauth2-mock-server, PKCE checked) and a stand-in for the platform's current-user endpoint. The
 * gateway's public address (API_BASE_URL) is `http://modelgate.test`, as behind a proxy: the test
 * browser maps it to the listener.
 */
const SECRET = 'o'.repeat(40)
const PUBLIC = 'http://modelgate.test'
const FRONTEND = 'http://frontend.test/app/'

const USERS = {
  alice: { uid: 'uid-alice', groups: ['system:authenticated', 'service-admins'] },
  bob: { uid: 'uid-bob', groups: ['service-admins-readonly', 'developers'] },
  carol: { uid: 'uid-carol', groups: ['developers'] },
  dave: { uid: 'uid-dave', groups: ['ops-root'] },
}

const probe = definePlugin({
  id: 'probe',
  description: 'test routes',
  config: T.Object({}, { additionalProperties: false }),
  setup: () => ({
    routes: new Elysia()
      .get('/api/models/things', () => ({ ok: true }))
      .post('/api/models/things', () => ({ created: true })),
  }),
}) as unknown as PluginDefinition

function oauthEnv(issuer: string, k8s: string): Record<string, string> {
  return {
    AUTH_MODE: 'oauth',
    JWT_SECRET: SECRET,
    OAUTH_ISSUER_URL: issuer,
    OAUTH_CLIENT_ID: 'modelgate',
    OAUTH_CLIENT_SECRET: 'client-secret',
    K8S_API_URL: k8s,
    API_BASE_URL: PUBLIC,
  }
}

/** bootOAuthHost: a host in OAuth mode whose auth events land in its captured logs. */
async function bootOAuthHost(
  env: Record<string, string>,
  oauthYaml = '',
  /** again: restart on this host's data dir and port (its cookies still apply). */
  again?: TestHost,
): Promise<TestHost> {
  const yaml = `auth:\n  oauth: { frontend_url: '${FRONTEND}', request_timeout_ms: 400${oauthYaml} }\nplugins:\n  probe: {}\n`
  const th = again
    ? await startHost(yaml, [probe], env, again.dataDir, {
        server: { port: Number(new URL(again.url).port) },
      })
    : await startHost(yaml, [probe], env)
  // The host's logger, as the host gives it (src/host/host.ts: auth.useLog).
  th.host.auth.useLog(th.host.log.child('auth'))
  return th
}

const failures = (th: TestHost) => th.logs.filter((l) => l.includes('oauth login failed'))

describe('OAuth mode against a provider that publishes RFC 8414 metadata', () => {
  let provider: Provider
  let platform: Platform
  let th: TestHost
  let browser: Browser
  const map = (u: string) => u.replace(PUBLIC, th.url)

  beforeAll(async () => {
    provider = await startProvider('rfc8414')
    platform = await startPlatform(USERS)
    th = await bootOAuthHost(oauthEnv(provider.issuer, platform.url))
  })
  afterAll(async () => {
    await th.stop()
    await platform.stop()
    await provider.stop()
  })

  /** login runs the browser from /api/auth/login (with the frontend's nonce, if given) to the callback's answer. */
  async function login(user: string, b = new Browser(map), nonce?: string) {
    browser = b
    provider.user = user
    const start = await b.get(`${PUBLIC}/api/auth/login${nonce ? `?nonce=${nonce}` : ''}`)
    expect(start.status).toBe(302)
    const authorize = start.headers.get('location')!
    const atProvider = await b.get(authorize)
    expect(atProvider.status).toBe(302)
    const callback = atProvider.headers.get('location')!
    const cookieBefore = b.clone()
    const res = await b.get(callback)
    return { authorize, callback, res, cookieBefore }
  }

  const api = (path: string, token: string, method = 'GET') =>
    fetch(`${th.url}${path}`, { method, headers: { authorization: `Bearer ${token}` } })

  it('tells the frontend how to log in (GET /api/auth/info)', async () => {
    const info = await (await fetch(`${th.url}/api/auth/info`)).json()
    expect(info).toMatchObject({
      mode: 'oauth',
      auth_enabled: true,
      login_url: '/api/auth/login',
      login_method: 'GET',
      oauth: {
        issuer_url: provider.issuer,
        callback_url: `${PUBLIC}/api/auth/callback`,
        frontend_url: FRONTEND,
        token_fragment_parameter: 'token',
        groups: { admin: ['service-admins'], 'admin-readonly': ['service-admins-readonly'] },
      },
    })
  })

  it('redirects to the discovered authorization endpoint with state and an S256 PKCE challenge', async () => {
    const b = new Browser(map)
    const res = await b.get(`${PUBLIC}/api/auth/login`)
    expect(res.status).toBe(302)
    const to = new URL(res.headers.get('location')!)
    expect(`${to.origin}${to.pathname}`).toBe(`${provider.issuer}/authorize`)
    expect(Object.fromEntries(to.searchParams)).toMatchObject({
      client_id: 'modelgate',
      redirect_uri: `${PUBLIC}/api/auth/callback`,
      response_type: 'code',
      scope: 'user:info',
      code_challenge_method: 'S256',
    })
    expect(to.searchParams.get('state')!.length).toBeGreaterThanOrEqual(32)
    expect(to.searchParams.get('code_challenge')).toMatch(/^[A-Za-z0-9_-]{43}$/)
    const cookie = res.headers.getSetCookie()[0]!
    expect(cookie).toStartWith(`${STATE_COOKIE}=`)
    expect(cookie).toContain('HttpOnly')
    expect(cookie).toContain('SameSite=Lax')
    expect(cookie).toContain('Path=/api/auth/callback')
    // Neither the state nor the verifier is readable from the cookie without the key; the state is
    // in it (signed), the verifier never leaves the browser's cookie and the gateway.
    expect(res.headers.get('cache-control')).toBe('no-store')
  })

  it('logs a service-admins member in as admin: JWT in the fragment, claims as the spec lists', async () => {
    const before = platform.tokens.length
    const { res } = await login('alice')
    expect(res.status).toBe(302)
    const location = res.headers.get('location')!
    expect(location.startsWith(FRONTEND)).toBe(true)
    const fragment = fragmentOf(location)
    const token = fragment.get('token')!
    expect(fragment.get('token_type')).toBe('Bearer')
    // Started without a nonce: none comes back.
    expect(fragment.has('nonce')).toBe(false)
    const claims = claimsOf(token)
    expect(claims).toMatchObject({ sub: 'uid-alice', username: 'alice', roles: ['admin'], authMode: 'oauth' })
    expect(typeof claims.iat).toBe('number')
    // The JWT never outlives the provider's access token (the mock's tokens last 3600 s).
    expect((claims.exp as number) - (claims.iat as number)).toBe(3600)
    expect(fragment.get('expires_in')).toBe('3600')
    // The user was read from the platform with the provider's access token.
    expect(platform.tokens.length).toBe(before + 1)
    expect(claimsOf(platform.tokens.at(-1)!).sub).toBe('alice')
    // The state cookie is gone; the token works.
    expect(browser.jar.get(new URL(th.url).host)?.has(STATE_COOKIE) ?? false).toBe(false)
    expect((await api('/api/models/things', token, 'POST')).status).toBe(200)
    expect(await (await api('/api/auth/me', token)).json()).toMatchObject({
      sub: 'uid-alice',
      username: 'alice',
      roles: ['admin'],
      authMode: 'oauth',
    })
    expect(th.logs.some((l) => l.includes('oauth login') && l.includes('username=alice'))).toBe(true)
  })

  it('logs a service-admins-readonly member in as admin-readonly: reads yes, writes 403', async () => {
    const { res } = await login('bob')
    expect(res.status).toBe(302)
    const token = fragmentOf(res.headers.get('location')!).get('token')!
    expect(claimsOf(token)).toMatchObject({ username: 'bob', roles: ['admin-readonly'], authMode: 'oauth' })
    expect((await api('/api/models/things', token)).status).toBe(200)
    const write = await api('/api/models/things', token, 'POST')
    expect(write.status).toBe(403)
    expect(await write.json()).toEqual({
      error: { code: 'FORBIDDEN', message: "This action requires the 'admin' role", statusCode: 403 },
    })
  })

  it('shows a member of neither group the access-denied page: required groups, a retry, no token', async () => {
    const logged = failures(th).length
    const { res } = await login('carol')
    expect(res.status).toBe(403)
    expect(res.headers.get('location')).toBeNull()
    expect(res.headers.get('content-type')).toContain('text/html')
    const html = await res.text()
    expect(html).toContain('Access denied')
    expect(html).toContain('<code>service-admins</code>')
    expect(html).toContain('<code>service-admins-readonly</code>')
    expect(html).toContain('<b>carol</b>')
    expect(html).toContain(`href="${PUBLIC}/api/auth/login"`)
    expect(html).not.toMatch(/eyJ[\w-]+\.[\w-]+\.[\w-]+/)
    // A page no other site may frame, running no script, its one style block allowed by its hash.
    const csp = res.headers.get('content-security-policy')!
    expect(csp).toContain("default-src 'none'")
    expect(csp).toContain("frame-ancestors 'none'")
    expect(csp).toMatch(/style-src 'sha256-[A-Za-z0-9+/]+=*'/)
    expect(csp).not.toContain('unsafe-')
    expect(res.headers.get('x-frame-options')).toBe('DENY')
    expect(res.headers.get('x-content-type-options')).toBe('nosniff')
    expect(failures(th).length).toBe(logged + 1)
    expect(failures(th).at(-1)).toContain('code=ACCESS_DENIED')
  })

  it("hands the frontend's login nonce back beside the token, and keeps it in the retry link of a failure", async () => {
    const nonce = 'n0nce-of-this-tab_0123456789abcdef'
    const { res } = await login('alice', new Browser(map), nonce)
    expect(res.status).toBe(302)
    const fragment = fragmentOf(res.headers.get('location')!)
    expect(fragment.get('nonce')).toBe(nonce)
    expect(claimsOf(fragment.get('token')!)).toMatchObject({ username: 'alice' })
    // Nowhere else: not in the provider's URLs (it is the tab's, not the provider's).
    const denied = await login('carol', new Browser(map), nonce)
    expect(denied.authorize).not.toContain(nonce)
    expect(denied.callback).not.toContain(nonce)
    expect(denied.res.status).toBe(403)
    expect(await denied.res.text()).toContain(`href="${PUBLIC}/api/auth/login?nonce=${nonce}"`)
  })

  it('refuses a malformed login nonce with 400 (page or controller shape), sending nobody to the provider', async () => {
    for (const bad of ['short', 'x'.repeat(129), `${'a'.repeat(30)}<script>`, `${'a'.repeat(30)}%20b`]) {
      const page = await new Browser(map).get(`${PUBLIC}/api/auth/login?nonce=${bad}`)
      expect(page.status).toBe(400)
      expect(page.headers.get('location')).toBeNull()
      expect(page.headers.getSetCookie()).toEqual([])
      const html = await page.text()
      expect(html).toContain('OAUTH_LOGIN_INVALID')
      expect(html).not.toContain('<script>')
      const json = await fetch(`${th.url}/api/auth/login?nonce=${bad}`, { redirect: 'manual' })
      expect(json.status).toBe(400)
      expect(((await json.json()) as { error: { code: string } }).error.code).toBe('OAUTH_LOGIN_INVALID')
    }
    // Twice is refused too, never a 500; another parameter beside it changes nothing.
    const twice = await fetch(`${th.url}/api/auth/login?nonce=${'a'.repeat(30)}&nonce=${'b'.repeat(30)}`, {
      redirect: 'manual',
    })
    expect(twice.status).toBe(400)
    expect((await new Browser(map).get(`${PUBLIC}/api/auth/login?lang=en`)).status).toBe(302)
  })

  it('answers an API client (no text/html) in the controller shape', async () => {
    provider.user = 'carol'
    const b = new Browser(map)
    const start = await b.get(`${PUBLIC}/api/auth/login`)
    const cb = (await b.get(start.headers.get('location')!)).headers.get('location')!
    const res = await b.get(cb, 'application/json')
    expect(res.status).toBe(403)
    const body = (await res.json()) as { error: { code: string; message: string; statusCode: number } }
    expect(body.error.code).toBe('ACCESS_DENIED')
    expect(body.error.statusCode).toBe(403)
    expect(body.error.message).toContain('service-admins')
  })

  it('refuses a forged state, a missing or tampered cookie, and a cookie of another login', async () => {
    const logged = failures(th).length
    // A state the gateway never issued, with no cookie.
    const bare = await new Browser(map).get(
      `${PUBLIC}/api/auth/callback?code=abc&state=forged`,
      'application/json',
    )
    expect(bare.status).toBe(400)
    expect(((await bare.json()) as { error: { code: string } }).error.code).toBe('OAUTH_STATE_INVALID')
    // The browser's own login cookie, but the state of another login.
    const b = new Browser(map)
    await b.get(`${PUBLIC}/api/auth/login`)
    const other = await b.get(`${PUBLIC}/api/auth/callback?code=abc&state=${'x'.repeat(43)}`)
    expect(other.status).toBe(400)
    expect(await other.text()).toContain('OAUTH_STATE_INVALID')
    // A tampered cookie (signature no longer matches).
    const c = new Browser(map)
    const start = await c.get(`${PUBLIC}/api/auth/login`)
    const state = new URL(start.headers.get('location')!).searchParams.get('state')!
    const jar = c.jar.get(new URL(th.url).host)!
    jar.set(STATE_COOKIE, `${jar.get(STATE_COOKIE)!.slice(0, -2)}AA`)
    const tampered = await c.get(`${PUBLIC}/api/auth/callback?code=abc&state=${state}`, 'application/json')
    expect(tampered.status).toBe(400)
    expect(((await tampered.json()) as { error: { code: string } }).error.code).toBe('OAUTH_STATE_INVALID')
    expect(failures(th).length).toBe(logged + 3)
  })

  it('refuses a replayed callback (state is single use) even with the original cookie', async () => {
    const { res, callback, cookieBefore } = await login('alice')
    expect(res.status).toBe(302)
    const replay = await cookieBefore.get(callback)
    expect(replay.status).toBe(400)
    const html = await replay.text()
    expect(html).toContain('already been used')
    expect(html).not.toMatch(/eyJ[\w-]+\.[\w-]+\.[\w-]+/)
  })

  it("reports the provider's error (escaped) without exchanging anything", async () => {
    const b = new Browser(map)
    const start = await b.get(`${PUBLIC}/api/auth/login`)
    const state = new URL(start.headers.get('location')!).searchParams.get('state')!
    const logged = failures(th).length
    const res = await b.get(
      `${PUBLIC}/api/auth/callback?error=access_denied&error_description=${encodeURIComponent('<script>x</script>\nFAKE log line')}&state=${state}`,
    )
    expect(res.status).toBe(401)
    const html = await res.text()
    expect(html).toContain('access_denied')
    expect(html).toContain('&lt;script&gt;')
    expect(html).not.toContain('<script>')
    expect(failures(th).length).toBe(logged + 1)
    expect(failures(th).at(-1)).toContain('code=OAUTH_PROVIDER_ERROR')
    // The provider's text cannot start a log line of its own.
    expect(failures(th).at(-1)).toContain('\\x0aFAKE log line')
    expect(th.logs.some((l) => l.split('\n').some((x) => x.startsWith('FAKE')))).toBe(false)
  })

  it('refuses a callback with a valid state but no code (400, not a provider failure)', async () => {
    const b = new Browser(map)
    const start = await b.get(`${PUBLIC}/api/auth/login`)
    const state = new URL(start.headers.get('location')!).searchParams.get('state')!
    const res = await b.get(`${PUBLIC}/api/auth/callback?state=${state}`, 'application/json')
    expect(res.status).toBe(400)
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('OAUTH_CALLBACK_INVALID')
  })

  it('refuses the login when the provider refuses the code exchange', async () => {
    provider.server.service.once(Events.BeforeResponse, (response) => {
      response.statusCode = 400
      response.body = { error: 'invalid_grant', error_description: 'code expired' }
    })
    const logged = failures(th).length
    const { res } = await login('alice')
    expect(res.status).toBe(401)
    expect(await res.text()).toContain('OAUTH_CODE_REJECTED')
    expect(failures(th).length).toBe(logged + 1)
    expect(failures(th).at(-1)).toContain('invalid_grant')
  })

  it('gives a clear 502 when the token endpoint fails', async () => {
    provider.server.service.once(Events.BeforeResponse, (response) => {
      response.statusCode = 500
      response.body = { error: 'server_error' }
    })
    const { res } = await login('alice')
    expect(res.status).toBe(502)
    expect(await res.text()).toContain('OAUTH_PROVIDER_FAILED')
  })

  it.each([
    ['answers 503', { kind: 'status', status: 503 } as const, 502, 'OAUTH_USER_LOOKUP_FAILED'],
    ['refuses the token', { kind: 'status', status: 401 } as const, 502, 'OAUTH_USER_LOOKUP_FAILED'],
    ['drops the connection', { kind: 'reset' } as const, 502, 'OAUTH_USER_LOOKUP_FAILED'],
    ['does not answer in time', { kind: 'hang' } as const, 504, 'OAUTH_USER_LOOKUP_TIMEOUT'],
  ])('ends on a clear error when the user endpoint %s', async (_name, mode, status, code) => {
    platform.mode = mode
    const logged = failures(th).length
    try {
      const { res } = await login('alice')
      expect(res.status).toBe(status)
      const html = await res.text()
      expect(html).toContain(code)
      expect(html).toContain('Try again')
      expect(html).not.toMatch(/eyJ[\w-]+\.[\w-]+\.[\w-]+/)
    } finally {
      platform.mode = { kind: 'ok' }
      platform.release()
    }
    expect(failures(th).length).toBe(logged + 1)
    expect(failures(th).at(-1)).toContain(`code=${code}`)
  })

  it('never answered 500 nor logged an unhandled error', () => {
    expect(th.logs.filter((l) => / 500 listener=/.test(l) || l.includes('unhandled error'))).toEqual([])
  })

  // Last: it restarts the host (the same data dir and port).
  it('refuses a used callback URL replayed with its cookie after the host restarts on the same data dir', async () => {
    const { res, callback, cookieBefore } = await login('alice')
    expect(res.status).toBe(302)
    expect(fragmentOf(res.headers.get('location')!).get('token')).toMatch(/^eyJ/)
    await th.stopKeep()
    th = await bootOAuthHost(oauthEnv(provider.issuer, platform.url), '', th)
    const exchanges = platform.tokens.length
    const replay = await cookieBefore.get(callback, 'application/json')
    expect(replay.status).toBe(400)
    const body = (await replay.json()) as { error: { code: string; message: string } }
    expect(body.error.code).toBe('OAUTH_STATE_INVALID')
    expect(body.error.message).toContain('already been used')
    // Refused before the code went anywhere: no user lookup with a token.
    expect(platform.tokens.length).toBe(exchanges)
    expect(failures(th).at(-1)).toContain('state already used')
  })
})

describe('OAuth mode against a provider without RFC 8414 metadata (OpenShift fallback)', () => {
  let provider: Provider
  let platform: Platform
  let th: TestHost
  const map = (u: string) => u.replace(PUBLIC, th.url)

  beforeAll(async () => {
    provider = await startProvider('openshift')
    platform = await startPlatform(USERS)
    th = await bootOAuthHost(oauthEnv(provider.issuer, platform.url), ', admin_groups: [ops-root]')
  })
  afterAll(async () => {
    await th.stop()
    await platform.stop()
    await provider.stop()
  })

  it("uses OpenShift's /oauth/authorize and /oauth/token, and configured group names", async () => {
    provider.user = 'dave'
    const b = new Browser(map)
    const start = await b.get(`${PUBLIC}/api/auth/login`)
    expect(start.headers.get('location')!.startsWith(`${provider.issuer}/oauth/authorize?`)).toBe(true)
    expect(th.host.auth.oauth?.discoverySource).toBe('fallback')
    const cb = (await b.get(start.headers.get('location')!)).headers.get('location')!
    const res = await b.get(cb)
    expect(res.status).toBe(302)
    expect(claimsOf(fragmentOf(res.headers.get('location')!).get('token')!)).toMatchObject({
      username: 'dave',
      roles: ['admin'],
    })
    // service-admins is no admin group here: alice is denied, and the page names ops-root.
    provider.user = 'alice'
    const b2 = new Browser(map)
    const s2 = await b2.get(`${PUBLIC}/api/auth/login`)
    const denied = await b2.get((await b2.get(s2.headers.get('location')!)).headers.get('location')!)
    expect(denied.status).toBe(403)
    expect(await denied.text()).toContain('<code>ops-root</code>')
  })
})

describe('OAuth mode with the provider down', () => {
  let platform: Platform
  let th: TestHost
  beforeAll(async () => {
    platform = await startPlatform(USERS)
    // A port that was free a moment ago: nothing listens there.
    const gone = Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response('') })
    const issuer = `http://127.0.0.1:${gone.port}`
    gone.stop(true)
    th = await bootOAuthHost(oauthEnv(issuer, platform.url))
  })
  afterAll(async () => {
    await th.stop()
    await platform.stop()
  })

  it('answers the login with 502 (page for a browser, controller shape for a client), logged once', async () => {
    const page = await new Browser((u) => u).get(`${th.url}/api/auth/login`)
    expect(page.status).toBe(502)
    expect(await page.text()).toContain('cannot be reached')
    const json = await fetch(`${th.url}/api/auth/login`, { redirect: 'manual' })
    expect(json.status).toBe(502)
    expect(((await json.json()) as { error: { code: string } }).error.code).toBe('OAUTH_PROVIDER_UNAVAILABLE')
    expect(failures(th).length).toBe(2)
  })
})

describe('OAuth mode outside OAuth mode, and its configuration', () => {
  it('answers GET /api/auth/login and /callback with 400 in simple mode', async () => {
    const th = await startHost('plugins:\n  probe: {}\n', [probe], {
      AUTH_MODE: 'simple',
      ADMIN_PASSWORD: 'pw',
      JWT_SECRET: SECRET,
    })
    try {
      for (const path of ['/api/auth/login', '/api/auth/callback?code=a&state=b']) {
        const res = await fetch(`${th.url}${path}`, { redirect: 'manual' })
        expect(res.status).toBe(400)
        expect(((await res.json()) as { error: { code: string } }).error.code).toBe('OAUTH_NOT_ENABLED')
      }
    } finally {
      await th.stop()
    }
  })

  it('names every missing or malformed key', () => {
    expect(oauthProblems({ issuer_url: 'ftp://x', client_id: 'c' })).toEqual([
      'auth.oauth.issuer_url: must be an http(s) URL',
      'auth.oauth.k8s_api_url: required when AUTH_MODE=oauth (K8S_API_URL)',
      'auth.oauth.api_base_url: required when AUTH_MODE=oauth (API_BASE_URL)',
      'auth.oauth.client_secret: required when AUTH_MODE=oauth (OAUTH_CLIENT_SECRET)',
    ])
  })

  it('refuses to start, naming nothing secret, when OAuth mode lacks its URLs', async () => {
    const err = await startHost('plugins:\n  probe: {}\n', [probe], {
      AUTH_MODE: 'oauth',
      JWT_SECRET: SECRET,
      OAUTH_ISSUER_URL: 'https://idp.test',
      OAUTH_CLIENT_ID: 'c',
      OAUTH_CLIENT_SECRET: 'client-secret',
    }).then(
      async (th) => {
        await th.stop()
        return null
      },
      (e: unknown) => e as Error,
    )
    expect(err).not.toBeNull()
    expect(String(err)).toContain('auth.oauth.k8s_api_url: required when AUTH_MODE=oauth (K8S_API_URL)')
    expect(String(err)).toContain('auth.oauth.api_base_url: required when AUTH_MODE=oauth (API_BASE_URL)')
    expect(String(err)).not.toContain('client-secret')
  })
})

describe('the login state', () => {
  let provider: Provider
  let platform: Platform
  let store: Store
  const dir = tempDataDir()
  beforeAll(async () => {
    provider = await startProvider('openshift')
    platform = await startPlatform(USERS)
    store = openStore(dir)
    applyMigrations(store, CORE_OWNER, coreMigrations)
  })
  afterAll(async () => {
    store.close()
    rmSync(dir, { recursive: true, force: true })
    await platform.stop()
    await provider.stop()
  })

  const flowAt = (clock: { now: number }) => {
    const flow = new OAuthFlow(
      oauthSettings({
        issuer_url: provider.issuer,
        client_id: 'c',
        client_secret: 's',
        k8s_api_url: platform.url,
        api_base_url: PUBLIC,
      })!,
      { secret: SECRET, now: () => clock.now },
    )
    flow.useStore(store)
    return flow
  }

  /** started: a login begun on `flow`, as its callback would present it (query and cookie header). */
  const started = async (flow: OAuthFlow) => {
    const { location, cookie } = await flow.start()
    const state = new URL(location).searchParams.get('state')!
    return { state, query: new URLSearchParams({ state }), header: cookie.split(';')[0]! }
  }

  it('is kept in the store until its login would have expired, then purged', async () => {
    const clock = { now: Date.now() }
    const flow = flowAt(clock)
    const used = new UsedStates(store.db)
    const before = used.size()
    const first = await started(flow)
    flow.checkState(first.query, first.header)
    expect(used.size()).toBe(before + 1)
    expect(() => flow.checkState(first.query, first.header)).toThrow('already been used')
    // Past the first login's expiry, a new login's callback purges its row.
    clock.now += 600_000
    const second = await started(flow)
    flow.checkState(second.query, second.header)
    expect(
      store.sqlite
        .query<{ state: string }, []>('SELECT state FROM oauth_used_states')
        .all()
        .map((r) => r.state),
    ).toEqual([second.state])
  })

  it('keeps at most its limit, dropping the soonest to expire', () => {
    const used = new UsedStates(store.db, 3)
    const now = Date.now() + 10_000_000
    for (const [i, s] of ['a', 'b', 'c', 'd'].entries())
      expect(used.consume(`cap-${s}`, now + 1000 + i, now)).toBe(true)
    expect(used.size()).toBe(3)
    expect(used.consume('cap-a', now + 2000, now)).toBe(true)
    expect(used.consume('cap-d', now + 2000, now)).toBe(false)
  })

  it('expires ten minutes after the login started', async () => {
    const clock = { now: Date.now() }
    const flow = flowAt(clock)
    const { location, cookie } = await flow.start()
    const state = new URL(location).searchParams.get('state')!
    const header = cookie.split(';')[0]!
    clock.now += 600_000
    expect(() => flow.checkState(new URLSearchParams({ state }), header)).toThrow('longer than 10 minutes')
    clock.now -= 1
    expect(flow.checkState(new URLSearchParams({ state }), header).s).toBe(state)
  })

  it("finds the provider through the platform API's metadata when the issuer publishes none", async () => {
    platform.metadata = {
      issuer: provider.issuer,
      authorization_endpoint: `${provider.issuer}/oauth/authorize`,
      token_endpoint: `${provider.issuer}/oauth/token`,
    }
    try {
      const flow = flowAt({ now: Date.now() })
      await flow.start()
      expect(flow.discoverySource).toBe(`${platform.url}/.well-known/oauth-authorization-server`)
    } finally {
      platform.metadata = null
    }
  })

  it('refuses metadata naming another issuer (502, not a silent switch)', async () => {
    platform.metadata = { issuer: 'https://evil.test', authorization_endpoint: 'https://evil.test/a' }
    try {
      const flow = flowAt({ now: Date.now() })
      const err = await flow.start().then(
        () => null,
        (e: unknown) => e,
      )
      expect(err).toMatchObject({ status: 502, code: 'OAUTH_DISCOVERY_INVALID' })
    } finally {
      platform.metadata = null
    }
  })

  it('ends a hung discovery at the deadline with 504', async () => {
    const hung = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      fetch: (req) =>
        new Promise<Response>((resolve) =>
          req.signal.addEventListener('abort', () => resolve(new Response(''))),
        ),
    })
    try {
      const flow = new OAuthFlow(
        {
          ...oauthSettings({
            issuer_url: `http://127.0.0.1:${hung.port}`,
            client_id: 'c',
            client_secret: 's',
            k8s_api_url: platform.url,
            api_base_url: PUBLIC,
          })!,
          requestTimeoutMs: 200,
        },
        { secret: SECRET },
      )
      const err = await flow.start().then(
        () => null,
        (e: unknown) => e,
      )
      expect(err).toMatchObject({ status: 504, code: 'OAUTH_PROVIDER_TIMEOUT' })
    } finally {
      hung.stop(true)
    }
  })
})
