import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { ADMIN_PASSWORD, AUTH_ENV } from '../keys/support.ts'
import { cleanupSims } from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'
import { startRouterWithGateway, type TestRouter } from './support.ts'

/**
 * Who sees which models, through a real gateway and router with admin auth on and inference keys:
 * the gateway's /v1/models and the router's /models and /v1/models list only what the caller's key
 * may use, every model once (active and catalogued ones, with their state on the gateway), and the
 * router gives engine addresses to an admin token alone.
 */
let r: TestRouter & { simDir: string }
let token = ''
let narrow = ''
let wide = ''

interface Listed {
  id: string
  state?: string
  endpoint?: { host: string; port: number }
}

const bearer = (secret: string) => ({ authorization: `Bearer ${secret}` })

async function admin<T>(method: string, path: string, body?: unknown): Promise<{ status: number; body: T }> {
  const res = await fetch(`${r.url}${path}`, {
    method,
    headers: { ...bearer(token), 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(20_000),
  })
  return { status: res.status, body: (await res.json()) as T }
}

async function list(base: string, path: string, headers: Record<string, string> = {}) {
  const res = await fetch(`${base}${path}`, { headers, signal: AbortSignal.timeout(20_000) })
  const body = (await res.json()) as { data?: Listed[]; error?: { code: string } }
  return { status: res.status, body }
}

const ids = (l: { body: { data?: Listed[] } }) => (l.body.data ?? []).map((m) => m.id).sort()

beforeAll(async () => {
  r = await startRouterWithGateway(
    [18880, 18889],
    'from_gateway: true\n',
    AUTH_ENV,
    `    catalog:
      - { name: resident, model_path: org/resident-7b, gpu_memory_utilization: 0.3, preload: true }
      - { name: later, model_path: org/later-7b, gpu_memory_utilization: 0.3 }
      - { name: elsewhere, model_path: org/elsewhere-7b, gpu_memory_utilization: 0.3 }
`,
  )
  const login = await fetch(`${r.url}/api/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'admin', password: ADMIN_PASSWORD }),
  })
  expect(login.status).toBe(200)
  token = ((await login.json()) as { token: string }).token
  await waitFor(
    'the preloaded model active',
    async () => {
      const { body } = await admin<{ models: { served_model_name: string; status: string }[] }>(
        'GET',
        '/api/v1/models',
      )
      return body.models.some((m) => m.served_model_name === 'resident' && m.status === 'active')
    },
    { timeoutMs: 30_000 },
  )
  const made = async (fields: Record<string, unknown>) => {
    const k = await admin<{ key: string }>('POST', '/api/keys', fields)
    expect(k.status).toBe(201)
    return k.body.key
  }
  narrow = await made({ name: 'narrow', models: ['resident', 'later'] })
  wide = await made({ name: 'wide' })
  await waitFor('the router follows the resident model', async () => {
    const l = await list(r.routerUrl, '/models', bearer(token))
    return ids(l).includes('resident')
  })
})

afterAll(async () => {
  await r?.stop()
  cleanupSims()
})

describe("the gateway's /v1/models", () => {
  it('lists every model a key may use once, a catalogued one not loaded as unloaded', async () => {
    const all = await list(r.url, '/v1/models', bearer(wide))
    expect(all.status).toBe(200)
    expect(all.body.data!.map((m) => [m.id, m.state])).toEqual([
      ['resident', 'active'],
      ['elsewhere', 'unloaded'],
      ['later', 'unloaded'],
    ])
  })

  it('shows a key with a model list only the models on it, and no key nothing (401)', async () => {
    const mine = await list(r.url, '/v1/models', bearer(narrow))
    expect(mine.status).toBe(200)
    expect(ids(mine)).toEqual(['later', 'resident'])
    const none = await list(r.url, '/v1/models')
    expect(none.status).toBe(401)
    expect(none.body.error?.code).toBe('missing_api_key')
    // The admin token is no inference key: the inference listing is refused with it.
    expect((await list(r.url, '/v1/models', bearer(token))).status).toBe(401)
  })
})

describe("the router's /models and /v1/models", () => {
  it('lists a key the models on its list, with no engine address', async () => {
    for (const path of ['/models', '/v1/models']) {
      const mine = await list(r.routerUrl, path, bearer(narrow))
      expect(mine.status).toBe(200)
      expect(ids(mine)).toEqual(['later', 'resident'])
      for (const m of mine.body.data!) expect(m.endpoint).toEqual({ host: '', port: 0 })
      const all = await list(r.routerUrl, path, bearer(wide))
      expect(ids(all)).toEqual(['elsewhere', 'later', 'resident'])
      for (const m of all.body.data!) expect(m.endpoint).toEqual({ host: '', port: 0 })
    }
  })

  it('gives the engine address of a loaded model to an admin token only', async () => {
    const seen = await list(r.routerUrl, '/models', bearer(token))
    expect(seen.status).toBe(200)
    expect(ids(seen)).toEqual(['elsewhere', 'later', 'resident'])
    const resident = seen.body.data!.find((m) => m.id === 'resident')!
    expect(resident.endpoint!.port).toBeGreaterThan(0)
    expect(resident.endpoint!.host).not.toBe('')
  })

  it('refuses a caller without a valid key or token, whatever it sends', async () => {
    const forged = `${token.slice(0, token.lastIndexOf('.'))}.${'A'.repeat(43)}`
    const cases: [string, Record<string, string>][] = [
      ['no key', {}],
      ['an unknown key', bearer('mg-not-a-key')],
      ['a token with a forged signature', bearer(forged)],
      ['a malformed header', { authorization: 'Bearer' }],
      ['a 4 kB bearer', bearer('x'.repeat(4096))],
    ]
    for (const [what, headers] of cases) {
      const l = await list(r.routerUrl, '/v1/models', headers)
      expect([what, l.status]).toEqual([what, 401])
      expect(l.body.data).toBeUndefined()
    }
  })
})
