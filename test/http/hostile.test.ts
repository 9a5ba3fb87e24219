import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { parse, rawExchange } from '../support/raw-client.ts'

/**
 * The listener as an attacker meets it: a real Host (gateway and benchmarks plugins, simulated
 * engines) with `auth.mode: simple` and an inference key, reached over raw TCP so that Host,
 * target and framing are exactly what a hostile client sends. Each finding of the one-serving-stack
 * review has its regression here; the walk over every route of /docs/json checks that no admin
 * route answers without a token and no inference route without the key, whatever the spelling.
 */

const SECRET = 'j'.repeat(40)
const KEY = 'sk-inference'
let gw: TestGateway
let port: number
let token: string

beforeAll(async () => {
  gw = await startGateway({
    ports: [27100, 27119],
    extraYaml:
      '  benchmarks: {}\n  cluster: { pod_id: solo, coordination: { kind: static, static: { leader: solo, peers: [] } } }\n',
    hostEnv: {
      AUTH_MODE: 'simple',
      ADMIN_PASSWORD: 'pw',
      JWT_SECRET: SECRET,
      INFERENCE_API_KEY: KEY,
      CLUSTER_SECRET: 'c'.repeat(32),
    },
  })
  port = Number(new URL(gw.url).port)
  const login = await fetch(`${gw.url}/api/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'admin', password: 'pw' }),
  })
  token = ((await login.json()) as { token: string }).token
})
afterAll(async () => {
  await gw?.stop()
})

/** send: one request over a new raw connection; the first response parsed. */
async function send(
  method: string,
  target: string,
  opts: { host?: string | null; body?: string; headers?: string } = {},
) {
  const host = opts.host === null ? '' : `Host: ${opts.host ?? '127.0.0.1'}\r\n`
  const body = opts.body ?? ''
  const len =
    body || method === 'POST' || method === 'PUT' ? `Content-Length: ${Buffer.byteLength(body)}\r\n` : ''
  const bytes = `${method} ${target} HTTP/1.1\r\n${host}${opts.headers ?? ''}${len}Connection: close\r\n\r\n${body}`
  const r = await rawExchange(port, bytes, { waitMs: 10_000, until: (t) => parse(t).length >= 1 })
  const res = parse(r.text)[0]
  if (!res)
    throw new Error(`no response to ${method} ${target} (Host ${opts.host}): ${JSON.stringify(r.text)}`)
  let json: { error?: Record<string, unknown> } = {}
  try {
    json = JSON.parse(res.body)
  } catch {}
  return { status: res.status, headers: res.headers, error: json.error ?? {}, text: res.body }
}

const instances = async () =>
  (await gw.json<{ models: unknown[] }>('/api/v1/models', { headers: { authorization: `Bearer ${token}` } }))
    .body.models

describe('the admin API without a token', () => {
  it('the reported bypass (/xx prefix, three-character Host) reaches nothing', async () => {
    const body = JSON.stringify({
      model_path: 'Qwen/Qwen2.5-7B-Instruct',
      extra_args: ['--trust-remote-code'],
    })
    for (const host of ['a', 'ab', 'abc', 'abcd', '']) {
      const r = await send('POST', '/xx/api/v1/models/load', {
        host,
        body,
        headers: 'Content-Type: application/json\r\n',
      })
      expect([r.status, r.error.code], `Host '${host}'`).toEqual([404, 'NOT_FOUND'])
      const direct = await send('POST', '/api/v1/models/load', {
        host,
        body,
        headers: 'Content-Type: application/json\r\n',
      })
      expect([direct.status, direct.error.code], `Host '${host}'`).toEqual([401, 'UNAUTHORIZED'])
    }
    expect(await instances()).toEqual([])
  })

  it('a short Host reaches the framework routes as any other (no 404 for `Host: gpu`)', async () => {
    for (const host of ['gpu', 'a', '']) {
      expect((await send('GET', '/api/health', { host })).status, `Host '${host}'`).toBe(200)
      const me = await send('GET', '/api/auth/me', {
        host,
        headers: `Authorization: Bearer ${token}\r\n`,
      })
      expect(me.status).toBe(200)
      expect(JSON.parse(me.text).username).toBe('admin')
    }
  })
})

describe('every route of /docs/json, spelled every way, with no credentials', () => {
  it('reaches no admin handler and no inference handler', async () => {
    const doc = (await (await fetch(`${gw.url}/docs/json`)).json()) as {
      paths: Record<string, Record<string, { 'x-auth'?: string }>>
    }
    const ops: { method: string; path: string; category: string }[] = []
    for (const [path, methods] of Object.entries(doc.paths))
      for (const [method, op] of Object.entries(methods))
        ops.push({
          method: method.toUpperCase(),
          path: path.replace(/\{[^}]+\}/g, 'x1'),
          category: op['x-auth'] ?? 'missing',
        })
    const guarded = ops.filter((o) => o.category === 'admin' || o.category === 'inference')
    // The document declares a category for every operation, and most of the API is guarded.
    expect(ops.filter((o) => o.category === 'missing')).toEqual([])
    expect(guarded.length).toBeGreaterThan(40)

    const spellings = (p: string): string[] => {
      const tail = p.slice(1)
      return [
        p,
        `/${p}`,
        `${p}/`,
        p.toUpperCase(),
        `${p};x=1`,
        `${p}?a=b`,
        `${p}%3Fa`,
        `/xx${p}`,
        `/./${tail}`,
        `/api/health/..${p}`,
        `/api/auth/..${p}`,
        `/docs/..${p}`,
        `/api/health/%2e%2e${p}`,
        `/api/auth/login/../..${p}`,
        `/${tail.replaceAll('/', '%2F')}`,
        `/${tail.replaceAll('/', '%2f')}`,
        p.replace(/\/([^/]*)$/, '/%2e/$1'),
        `http://a${p}`,
      ]
    }
    const hosts = ['', 'a', 'ab', 'abc', 'abcd', '127.0.0.1:1']
    let sent = 0
    const failures: string[] = []
    for (const op of guarded) {
      const body = op.method === 'GET' || op.method === 'DELETE' ? undefined : '{}'
      let k = 0
      for (const target of spellings(op.path)) {
        // Every spelling with one Host of the list in turn, the plain path with each of them.
        const hostList = target === op.path ? hosts : [hosts[k++ % hosts.length]!]
        for (const host of hostList) {
          const absolute = target.startsWith('http://')
          const r = await send(op.method, target, {
            host: absolute ? 'a' : host,
            ...(body ? { body, headers: 'Content-Type: application/json\r\n' } : {}),
          })
          sent++
          if (!refusedBeforeHandler(op.category, r))
            failures.push(`${op.method} ${target} Host '${host}' → ${r.status} ${r.text.slice(0, 120)}`)
        }
      }
    }
    expect(failures).toEqual([])
    expect(sent).toBeGreaterThan(1000)
    expect(await instances()).toEqual([])
  }, 180_000)
})

/**
 * refusedBeforeHandler: the answer can only have come from the guard (401), the router finding no
 * route (404 NOT_FOUND / not_found with "No route"), or the front refusing the request line (400).
 * A handler's own answers (2xx, 404 for an unknown id, 400 VALIDATION_ERROR, 409, 503…) fail.
 */
function refusedBeforeHandler(category: string, r: Awaited<ReturnType<typeof send>>): boolean {
  const msg = String(r.error.message ?? '')
  if (r.status === 404) return msg.startsWith('No route for')
  if (r.status === 400) return r.error.code === 'BAD_REQUEST'
  if (r.status !== 401) return false
  // The shape follows the route's category: the controller shape for admin, the proxy shape for
  // inference, Anthropic's (no code) for the Messages API.
  if (category === 'admin') return r.error.code === 'UNAUTHORIZED' && r.error.statusCode === 401
  const anthropic = r.error.code === undefined && JSON.parse(r.text).type === 'error'
  return (anthropic || r.error.code === 'missing_api_key') && r.error.type === 'authentication_error'
}

describe('bodies that attack the parser', () => {
  const deep = (n: number) => '['.repeat(n) + ']'.repeat(n)

  it('refuses deeply nested JSON with 400 before parsing it, on admin and public routes alike', async () => {
    const auth = `Authorization: Bearer ${token}\r\nContent-Type: application/json\r\n`
    for (const [path, headers] of [
      ['/api/benchmarks', auth],
      ['/api/v1/models/load', auth],
      ['/api/auth/login', 'Content-Type: application/json\r\n'],
    ] as const) {
      const r = await send('POST', path, { body: deep(20_000), headers })
      expect([r.status, r.error.code, r.error.message], path).toEqual([
        400,
        'BAD_REQUEST',
        'JSON body nested deeper than 64',
      ])
    }
    // A body at the depth limit goes on to validation, which answers in the route's own shape.
    const ok = await send('POST', '/api/benchmarks', { body: `{"a":${deep(60)}}`, headers: auth })
    expect([ok.status, ok.error.code]).toEqual([400, 'VALIDATION_ERROR'])
  })

  it('refuses a non-inference body over the admin limit from its head alone (413)', async () => {
    const head = `POST /api/benchmarks HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: ${32 * 1024 * 1024}\r\n\r\n`
    const r = await rawExchange(port, head, { waitMs: 5000 })
    expect(r.closed).toBe(true)
    expect(parse(r.text)[0]!.status).toBe(413)
  })

  it('throttles password logins per client address: 429 with Retry-After past the limit', async () => {
    const login = (password: string) =>
      send('POST', '/api/auth/login', {
        body: JSON.stringify({ username: 'admin', password }),
        headers: 'Content-Type: application/json\r\n',
      })
    // The beforeAll login took one attempt of this address's ten.
    for (let i = 0; i < 9; i++) expect((await login('wrong')).status).toBe(401)
    const limited = await login('pw')
    expect([limited.status, limited.error.code]).toEqual([429, 'TOO_MANY_REQUESTS'])
    expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0)
    // The rest of the API is not affected.
    expect((await send('GET', '/api/health')).status).toBe(200)
  })
})

describe('catalogue bodies and names that attack the gateway', () => {
  const auth = () => `Authorization: Bearer ${token}\r\nContent-Type: application/json\r\n`
  const putEntry = (target: string, body: unknown) =>
    send('PUT', target, { body: typeof body === 'string' ? body : JSON.stringify(body), headers: auth() })
  /** stored: which of `names` the catalogue holds (each test checks its own, so one failure stays its own). */
  const stored = async (...names: string[]) =>
    (
      await gw.json<{ entries: { name: string }[] }>('/api/catalog', {
        headers: { authorization: `Bearer ${token}` },
      })
    ).body.entries
      .map((e) => e.name)
      .filter((n) => names.includes(n))
  const good = { model_path: 'facebook/opt-125m' }

  it('refuses unknown keys, naming them, and stores nothing', async () => {
    const r = await putEntry('/api/catalog/unknown-keys', { ...good, pinned: true, extra_arg: ['--x'] })
    expect([r.status, r.error.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(r.error.message).toContain('pinned')
    expect(r.error.message).toContain('extra_arg')
    // The name too is the path's, never the body's.
    const named = await putEntry('/api/catalog/unknown-keys', { ...good, name: 'other' })
    expect([named.status, named.error.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(named.error.message).toContain('name')
    // The same through the spelling with the name's slash left plain.
    const plain = await putEntry('/api/catalog/org/unknown-keys', { ...good, pinned: true })
    expect([plain.status, plain.error.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(plain.error.message).toContain('pinned')
    expect(await stored('unknown-keys', 'other', 'org/unknown-keys')).toEqual([])
  })

  it('refuses 65 extra_args and an argument of 2 KiB', async () => {
    const many = await putEntry('/api/catalog/many-args', {
      ...good,
      extra_args: Array(65).fill('--enforce-eager'),
    })
    expect([many.status, many.error.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(many.error.message).toContain('extra_args')
    const long = await putEntry('/api/catalog/many-args', {
      ...good,
      extra_args: [`--x=${'a'.repeat(2048)}`],
    })
    expect([long.status, long.error.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(long.error.message).toContain('extra_args')
    // At the limits it is accepted.
    const edge = await putEntry('/api/catalog/edge', {
      ...good,
      extra_args: [`--x=${'a'.repeat(1020)}`, ...Array(63).fill('--enforce-eager')],
    })
    expect(edge.status).toBe(201)
    expect(await stored('many-args', 'edge')).toEqual(['edge'])
    expect((await send('DELETE', '/api/catalog/edge', { headers: auth() })).status).toBe(200)
  })

  it('refuses a name that is a path, however it is spelled, saying why', async () => {
    const cases: [target: string, why: string][] = [
      ['/api/catalog/..%2Fx', 'must not contain a . or .. segment'],
      ['/api/catalog/x%2F..', 'must not contain a . or .. segment'],
      ['/api/catalog/%2Fabs', 'must not start with /'],
      ['/api/catalog//abs', 'must not start with /'],
      ['/api/catalog/a%2F%2Fb', 'must not contain an empty path segment'],
      ['/api/catalog/a//b', 'must not contain an empty path segment'],
      ['/api/catalog/a%5Cb', 'must not contain a backslash'],
      ['/api/catalog/a%00b', 'must not contain control characters'],
      ['/api/catalog/a%0Ab', 'must not contain control characters'],
      [`/api/catalog/${'x'.repeat(129)}`, 'at most 128'],
    ]
    for (const [target, why] of cases) {
      const r = await putEntry(target, good)
      expect([r.status, r.error.code], target).toEqual([400, 'VALIDATION_ERROR'])
      expect(r.error.message, target).toContain(why)
      const d = await send('DELETE', target, { headers: auth() })
      expect([d.status, d.error.code], `DELETE ${target}`).toEqual([400, 'VALIDATION_ERROR'])
    }
    // Dot segments left plain never get past the front; a broken escape is no name at all.
    for (const target of ['/api/catalog/../x', '/api/catalog/a/./b', '/api/catalog/%E0%A4%A']) {
      const r = await putEntry(target, good)
      expect(r.status, target).toBe(400)
    }
    const names = ['../x', 'x/..', '/abs', 'a//b', 'a\\b', 'a\u0000b', 'a\nb', 'x'.repeat(129), 'x', 'a/./b']
    expect(await stored(...names)).toEqual([])
  })

  it('refuses a 10,000-deep JSON body before parsing it, and a 20 MB body from its head (413)', async () => {
    const deep = `{"model_path":"a/b","extra_args":${'['.repeat(10_000)}${']'.repeat(10_000)}}`
    const r = await putEntry('/api/catalog/deep', deep)
    expect([r.status, r.error.code, r.error.message]).toEqual([
      400,
      'BAD_REQUEST',
      'JSON body nested deeper than 64',
    ])
    const size = 20 * 1024 * 1024
    const head = `PUT /api/catalog/big HTTP/1.1\r\nHost: a\r\n${auth()}Content-Length: ${size}\r\n\r\n`
    const big = await rawExchange(port, `${head}{"model_path":"${'a'.repeat(64 * 1024)}`, { waitMs: 5000 })
    expect(big.closed).toBe(true)
    expect(parse(big.text)[0]!.status).toBe(413)
    expect(await stored('deep', 'big')).toEqual([])
  })
})
