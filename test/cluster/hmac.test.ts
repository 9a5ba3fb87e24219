import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'bun:test'
import { createHmac } from 'node:crypto'
import { rmSync } from 'node:fs'
import { Type as T } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import { checkClusterSecrets, InternalVerifier, signRequest } from '../../plugins/cluster/signing.ts'
import { ConfigError } from '../../src/config/load.ts'
import { definePlugin, type PluginDefinition, type RawRoute } from '../../src/host/plugin.ts'
import { startHost, type TestHost, tempDataDir } from '../support/host.ts'

/**
 * The signed internal API, through a real socket to the real listener with auth on: a test-only
 * plugin installs the cluster's verifier for pod `pod-b` (driven by a clock the test owns, so
 * "within one second" and "31 s old" are exact) and mounts internal routes that record every run of
 * their handlers. Requests are addressed to `pod-b` (`to=` in the signed query) unless a test says.
 */
const SECRET = 'current-cluster-secret-0123456789'
const PREVIOUS = 'previous-cluster-secret-012345678'
const RETIRED = 'retired-cluster-secret-012345678'
const JWT_SECRET = 'j'.repeat(32)
const KEY = 'sk-inference-test-key'
/** The listener's pod id. */
const SELF = 'pod-b'
const AUTH_ENV = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'hunter2', JWT_SECRET, INFERENCE_API_KEY: KEY }

let clock = Date.now()
/** ran: every handler run, by route. */
const ran: string[] = []

/** hot is a wire route under /internal/ (the shape of the pod-to-pod inference hop). */
const hot: RawRoute = {
  match: (path) => path === '/internal/v1/hot',
  wire(req) {
    ran.push('hot')
    return { json: { hot: true, pod: req.header('x-cluster-pod') } }
  },
}

/** A route declaring itself internal (x-auth), read by the guard from the mounted routes. */
const INTERNAL_DETAIL = { summary: 'an internal route off the /internal/ prefix', 'x-auth': 'internal' }

function probe(withVerifier: boolean): PluginDefinition {
  return definePlugin({
    id: 'probe',
    description: 'internal routes for the HMAC tests',
    config: T.Object({}, { additionalProperties: false }),
    setup(ctx) {
      const auth = ctx.config.auth
      if (withVerifier) {
        checkClusterSecrets(auth)
        ctx.auth.useInternalVerifier(
          new InternalVerifier({
            podId: SELF,
            secrets: [auth.cluster_secret!, auth.cluster_secret_previous ?? ''],
            rateLimit: 100,
            now: () => clock,
          }),
        )
      }
      return {
        rawRoutes: [hot],
        routes: new Elysia()
          .get('/internal/ping', ({ headers }) => {
            ran.push('ping')
            return {
              pong: true,
              pod: headers['x-cluster-pod'] ?? null,
              term: headers['x-cluster-term'] ?? null,
            }
          })
          .post('/internal/echo', ({ body, headers }) => {
            ran.push('echo')
            return { body, token: headers['x-modelgate-internal'] ?? null }
          })
          // An internal route at a path the front does not read as /internal/: only the guard stands.
          .get(
            '/cluster-probe',
            () => {
              ran.push('cluster-probe')
              return { ran: true }
            },
            { detail: INTERNAL_DETAIL },
          ),
      }
    },
  }) as unknown as PluginDefinition
}

/** addressed: `target` naming pod `to` as its destination, written here on its own. */
function addressed(target: string, to: string): string {
  return `${target}${target.includes('?') ? '&' : '?'}to=${encodeURIComponent(to)}`
}

/** sign: the spec's HMAC, computed here on its own (not with the code under test). */
function sign(secret: string, method: string, target: string, ts: number, body: string): string {
  return createHmac('sha256', secret).update(`${method}${target}${ts}${body}`).digest('hex')
}

interface Send {
  method: string
  target: string
  body?: string
  secret?: string
  ts?: number
  /** What is sent, when it differs from what was signed. */
  sent?: { method?: string; target?: string; body?: string }
  omit?: 'signature' | 'timestamp'
  headers?: Record<string, string>
  /** The destination pod appended to the target (signed and sent); default SELF, null: none. */
  to?: string | null
}

async function errorOf(res: Response) {
  return ((await res.json()) as { error: Record<string, unknown> }).error
}

describe('signed internal API', () => {
  let th: TestHost
  beforeAll(async () => {
    th = await startHost(
      `auth:\n  cluster_secret_previous: ${PREVIOUS}\nplugins:\n  probe: {}\n`,
      [probe(true)],
      {
        ...AUTH_ENV,
        CLUSTER_SECRET: SECRET,
      },
    )
  })
  afterAll(() => th.stop())
  // Each test starts a second after the last: the rate window of the last one is over.
  beforeEach(() => {
    clock += 2000
  })

  function send(s: Send): Promise<Response> {
    const ts = s.ts ?? clock
    const body = s.body ?? ''
    const to = s.to === undefined ? SELF : s.to
    const address = (t: string) => (to === null ? t : addressed(t, to))
    const target = address(s.target)
    const headers: Record<string, string> = {
      'x-cluster-signature': sign(s.secret ?? SECRET, s.method, target, ts, body),
      'x-cluster-timestamp': String(ts),
      'x-cluster-pod': 'pod-a',
      'x-cluster-term': '3',
      ...(body ? { 'content-type': 'application/json' } : {}),
      ...s.headers,
    }
    if (s.omit) delete headers[`x-cluster-${s.omit}`]
    const sentBody = s.sent?.body ?? body
    return fetch(`${th.url}${s.sent?.target ? address(s.sent.target) : target}`, {
      method: s.sent?.method ?? s.method,
      headers,
      ...(sentBody ? { body: sentBody } : {}),
    })
  }

  /** refused: the request is answered `status` with the controller shape, and no handler ran. */
  async function refused(res: Response, status: number, code: string, message: string | RegExp) {
    const before = ran.length
    expect(res.status).toBe(status)
    const error = await errorOf(res)
    expect(error.code).toBe(code)
    expect(error.statusCode).toBe(status)
    expect(String(error.message)).toMatch(message)
    expect(ran.length).toBe(before)
  }

  it('signs as the spec says: method, path with query, timestamp, raw body', () => {
    const body = '{"a":"é"}'
    expect(signRequest(SECRET, 'POST', '/internal/echo?x=1', 1700000000000, Buffer.from(body))).toBe(
      sign(SECRET, 'POST', '/internal/echo?x=1', 1700000000000, body),
    )
  })

  it('accepts a valid request and hands the sender pod and term to the route', async () => {
    const res = await send({ method: 'GET', target: '/internal/ping' })
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual({ pong: true, pod: 'pod-a', term: '3' })
    const echo = await send({ method: 'POST', target: '/internal/echo', body: '{"n":1,"s":"é"}' })
    expect(echo.status).toBe(200)
    expect(((await echo.json()) as { body: unknown }).body).toEqual({ n: 1, s: 'é' })
  })

  it('refuses a replay of the exact request', async () => {
    const ts = clock
    expect((await send({ method: 'POST', target: '/internal/echo', body: '{"n":1}', ts })).status).toBe(200)
    await refused(
      await send({ method: 'POST', target: '/internal/echo', body: '{"n":1}', ts }),
      401,
      'UNAUTHORIZED',
      'Replayed cluster request',
    )
  })

  it('refuses a signed request addressed to another pod, or to none, with 403 WRONG_DESTINATION', async () => {
    await refused(
      await send({ method: 'POST', target: '/internal/echo', body: '{"n":1}', to: 'pod-c' }),
      403,
      'WRONG_DESTINATION',
      "Signed cluster request is for pod 'pod-c', not this pod ('pod-b')",
    )
    await refused(
      await send({ method: 'GET', target: '/internal/ping', to: null }),
      403,
      'WRONG_DESTINATION',
      "Signed cluster request names no destination pod (to=); this is pod 'pod-b'",
    )
    // The first `to` names the destination; a second one changes nothing.
    await refused(
      await send({ method: 'GET', target: '/internal/ping?to=pod-c' }),
      403,
      'WRONG_DESTINATION',
      /for pod 'pod-c'/,
    )
    // Addressed to this pod, after another query parameter: accepted.
    expect((await send({ method: 'GET', target: '/internal/ping?x=1' })).status).toBe(200)
  })

  it('refuses a timestamp 31 s old or 31 s ahead, and accepts 29 s either way', async () => {
    await refused(
      await send({ method: 'GET', target: '/internal/ping', ts: clock - 31_000 }),
      401,
      'UNAUTHORIZED',
      /30 s old/,
    )
    await refused(
      await send({ method: 'GET', target: '/internal/ping', ts: clock + 31_000 }),
      401,
      'UNAUTHORIZED',
      /30 s ahead/,
    )
    expect((await send({ method: 'GET', target: '/internal/ping', ts: clock - 29_000 })).status).toBe(200)
    expect((await send({ method: 'GET', target: '/internal/ping', ts: clock + 29_000 })).status).toBe(200)
  })

  it('refuses a timestamp that is not an integer', async () => {
    const res = await send({
      method: 'GET',
      target: '/internal/ping',
      headers: { 'x-cluster-timestamp': `${clock}.5` },
    })
    await refused(res, 401, 'UNAUTHORIZED', /must be an integer/)
  })

  it('refuses a request whose body, path, query or method differ from what was signed', async () => {
    const body = '{"n":1}'
    const echo = { method: 'POST', target: '/internal/echo', body }
    await refused(
      await send({ ...echo, sent: { body: '{"n":2}' } }),
      401,
      'UNAUTHORIZED',
      'Invalid cluster signature',
    )
    await refused(
      await send({ method: 'GET', target: '/internal/state', sent: { target: '/internal/ping' } }),
      401,
      'UNAUTHORIZED',
      'Invalid cluster signature',
    )
    await refused(
      await send({ method: 'GET', target: '/internal/ping?a=1', sent: { target: '/internal/ping?a=2' } }),
      401,
      'UNAUTHORIZED',
      'Invalid cluster signature',
    )
    await refused(
      await send({ ...echo, method: 'PUT', sent: { method: 'POST' } }),
      401,
      'UNAUTHORIZED',
      'Invalid cluster signature',
    )
    // The same request unchanged passes: the refusals above are the change, not the request.
    expect((await send(echo)).status).toBe(200)
  })

  it('accepts both rotation secrets and refuses a retired one', async () => {
    expect((await send({ method: 'GET', target: '/internal/ping', secret: SECRET })).status).toBe(200)
    expect((await send({ method: 'GET', target: '/internal/ping?p=1', secret: PREVIOUS })).status).toBe(200)
    await refused(
      await send({ method: 'GET', target: '/internal/ping?r=1', secret: RETIRED }),
      401,
      'UNAUTHORIZED',
      'Invalid cluster signature',
    )
  })

  it('refuses a request missing either header', async () => {
    await refused(
      await send({ method: 'GET', target: '/internal/ping', omit: 'signature' }),
      401,
      'UNAUTHORIZED',
      'Missing X-Cluster-Signature header',
    )
    await refused(
      await send({ method: 'GET', target: '/internal/ping', omit: 'timestamp' }),
      401,
      'UNAUTHORIZED',
      'Missing X-Cluster-Timestamp header',
    )
  })

  it('never lets a client forge the front-verified token header', async () => {
    const forged = { 'x-modelgate-internal': 'forged' }
    // Unsigned, the forged header changes nothing.
    await refused(
      await fetch(`${th.url}/internal/ping`, { headers: forged }),
      401,
      'UNAUTHORIZED',
      'Missing X-Cluster-Signature header',
    )
    // On an internal route the front does not vet, only the guard stands: the forgery is refused.
    await refused(
      await fetch(`${th.url}/cluster-probe`, { headers: forged }),
      401,
      'UNAUTHORIZED',
      'Internal routes accept only signed cluster requests',
    )
    // Signed, the route sees the front's own token, never the client's copy.
    const res = await send({ method: 'POST', target: '/internal/echo', body: '{}', headers: forged })
    expect(res.status).toBe(200)
    expect(((await res.json()) as { token: string }).token).toMatch(/^[0-9a-f]{64}$/)
  })

  it('accepts neither the admin JWT nor the inference key on /internal/*', async () => {
    const login = await fetch(`${th.url}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'admin', password: 'hunter2' }),
    })
    const { token } = (await login.json()) as { token: string }
    for (const bearer of [token, KEY])
      await refused(
        await fetch(`${th.url}/internal/ping`, { headers: { authorization: `Bearer ${bearer}` } }),
        401,
        'UNAUTHORIZED',
        'Missing X-Cluster-Signature header',
      )
  })

  it('vets a hot route under /internal/ before it answers, without the inference key', async () => {
    await refused(
      await fetch(`${th.url}/internal/v1/hot`),
      401,
      'UNAUTHORIZED',
      'Missing X-Cluster-Signature header',
    )
    const res = await send({ method: 'GET', target: '/internal/v1/hot' })
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual({ hot: true, pod: 'pod-a' })
  })

  it('refuses the 101st request within one second from one address with 429, sparing the inference hop', async () => {
    for (let i = 0; i < 100; i++) {
      const res = await send({ method: 'GET', target: `/internal/ping?n=${i}` })
      expect(res.status).toBe(200)
    }
    const excess = await send({ method: 'GET', target: '/internal/ping?n=100' })
    expect(excess.headers.get('retry-after')).toBe('1')
    await refused(excess, 429, 'RATE_LIMITED', 'More than 100 internal requests a second')
    // The pod-to-pod inference hop (/internal/v1/) is exempt from the rate limit only.
    for (let i = 0; i < 3; i++)
      expect((await send({ method: 'GET', target: `/internal/v1/hot?n=${i}` })).status).toBe(200)
    clock += 1000
    expect((await send({ method: 'GET', target: '/internal/ping?n=101' })).status).toBe(200)
  })
})

describe('internal API without a verifier', () => {
  let th: TestHost
  beforeAll(async () => {
    th = await startHost('plugins:\n  probe: {}\n', [probe(false)], AUTH_ENV)
  })
  afterAll(() => th.stop())

  it('refuses every /internal/* request with 403, signed or not', async () => {
    const ts = Date.now()
    const cases: Record<string, string>[] = [
      {},
      {
        'x-cluster-signature': sign(SECRET, 'GET', '/internal/ping', ts, ''),
        'x-cluster-timestamp': String(ts),
      },
    ]
    for (const headers of cases) {
      const before = ran.length
      const res = await fetch(`${th.url}/internal/ping`, { headers })
      expect(res.status).toBe(403)
      expect(await errorOf(res)).toEqual({
        code: 'FORBIDDEN',
        message: 'Internal routes accept only signed cluster requests',
        statusCode: 403,
      })
      expect(ran.length).toBe(before)
    }
  })
})

describe('cluster secrets at start-up', () => {
  async function bootError(env: Record<string, string>, yaml = ''): Promise<string[]> {
    const dir = tempDataDir()
    try {
      await startHost(`${yaml}plugins:\n  probe: {}\n`, [probe(true)], { ...AUTH_ENV, ...env }, dir)
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError)
      return (err as ConfigError).problems
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
    throw new Error('the host started')
  }

  it('refuses a secret under 16 characters, naming its dotted path', async () => {
    expect(await bootError({ CLUSTER_SECRET: 'fifteen-chars!!' })).toEqual([
      'auth.cluster_secret: must be at least 16 characters',
    ])
    expect(
      await bootError({ CLUSTER_SECRET: SECRET }, 'auth:\n  cluster_secret_previous: short-secret\n'),
    ).toEqual(['auth.cluster_secret_previous: must be at least 16 characters'])
  })

  it('refuses cluster mode without a secret', async () => {
    const problems = await bootError({})
    expect(problems).toHaveLength(1)
    expect(problems[0]).toStartWith('auth.cluster_secret: required')
  })

  it('checks the secrets a plugin is given the same way (16 characters pass, 15 do not)', () => {
    expect(() => checkClusterSecrets({ cluster_secret: 'sixteen-chars-ok' })).not.toThrow()
    expect(() =>
      checkClusterSecrets({ cluster_secret: SECRET, cluster_secret_previous: 'fifteen-chars!!' }),
    ).toThrow('auth.cluster_secret_previous: must be at least 16 characters')
    expect(() => checkClusterSecrets({}, false)).not.toThrow()
  })
})
