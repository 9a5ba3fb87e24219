import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { DASHBOARD_CSP } from '../../src/dashboard/routes.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { readSse } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The dashboard's routes on a real gateway in simple mode with an inference key: the page and its
 * assets are public and say where the page may connect; the event stream and the inference key
 * need a JWT of either role.
 */
const KEY = 'sk-dashboard-routes'
let gw: TestGateway
let admin: string
let readonly: string

beforeAll(async () => {
  gw = await startGateway({
    ports: [18900, 18909],
    hostEnv: {
      AUTH_MODE: 'simple',
      ADMIN_PASSWORD: 'pw-routes',
      JWT_SECRET: 'd'.repeat(40),
      INFERENCE_API_KEY: KEY,
    },
  })
  admin = (await gw.host.auth.issueToken('admin', ['admin'])).token
  readonly = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
})
afterAll(() => gw.stop())

const get = (path: string, headers: Record<string, string> = {}) => fetch(`${gw.url}${path}`, { headers })

describe('the dashboard page', () => {
  it('is served at / without a token, with a CSP that allows only this origin and no inline script', async () => {
    const res = await get('/')
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toContain('text/html')
    expect(res.headers.get('content-security-policy')).toBe(DASHBOARD_CSP)
    expect(DASHBOARD_CSP).toContain("default-src 'self'")
    expect(DASHBOARD_CSP).toContain("connect-src 'self'")
    expect(DASHBOARD_CSP).toContain("script-src 'self'")
    expect(DASHBOARD_CSP).not.toContain('unsafe-inline')
    expect(res.headers.get('cache-control')).toBe('no-cache')
    // At least as strict as /docs: no framing (old browsers too), nosniff, no Referer, its own opener group.
    expect(DASHBOARD_CSP).toContain("frame-ancestors 'none'")
    expect(res.headers.get('x-frame-options')).toBe('DENY')
    expect(res.headers.get('x-content-type-options')).toBe('nosniff')
    expect(res.headers.get('referrer-policy')).toBe('no-referrer')
    expect(res.headers.get('cross-origin-opener-policy')).toBe('same-origin')
    const html = await res.text()
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/)
    expect(html).not.toMatch(/https?:\/\//)
    expect(html).not.toContain(KEY)
  })

  it('names hashed assets that are public and cached for a year, gzipped when asked', async () => {
    const html = await (await get('/')).text()
    const assets = [...html.matchAll(/(?:src|href)="(\/assets\/[^"]+)"/g)].map((m) => m[1]!)
    expect(assets.some((a) => /\/assets\/index-[a-z0-9]+\.js$/.test(a))).toBe(true)
    expect(assets.some((a) => /\/assets\/index-[a-z0-9]+\.css$/.test(a))).toBe(true)
    for (const a of assets) {
      const plain = await get(a, { 'accept-encoding': 'identity' })
      expect(plain.status).toBe(200)
      expect(plain.headers.get('cache-control')).toBe('public, max-age=31536000, immutable')
      const body = new Uint8Array(await plain.arrayBuffer())
      const zipped = await get(a, { 'accept-encoding': 'gzip' })
      expect(zipped.headers.get('content-encoding')).toBe('gzip')
      // fetch inflates it: the same bytes come out.
      expect(new Uint8Array(await zipped.arrayBuffer())).toEqual(body)
      expect((await get(a, { 'if-none-match': plain.headers.get('etag')! })).status).toBe(304)
    }
    const js = await (await get(assets.find((a) => a.endsWith('.js'))!)).text()
    expect(js).not.toContain(KEY)
    expect(js).not.toMatch(/@sinclair\/typebox|TypeBox/)
  })

  it('answers an unknown asset with 404 in the controller shape', async () => {
    const res = await get('/assets/nothing-here.js')
    expect(res.status).toBe(404)
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('NOT_FOUND')
  })

  it('documents the page and the dashboard routes in /docs, the page as public', async () => {
    const doc = (await (await get('/docs/json')).json()) as {
      paths: Record<string, Record<string, Record<string, unknown>>>
    }
    expect(doc.paths['/']?.get?.['x-auth']).toBe('public')
    expect(doc.paths['/api/dashboard/events']?.get?.['x-required-role']).toBe('admin-readonly')
    expect(doc.paths['/api/dashboard/inference-key']?.get?.['x-required-role']).toBe('admin')
    expect(Object.keys(doc.paths).some((p) => p.startsWith('/assets'))).toBe(false)
  })
})

describe('the inference key for the chat playground', () => {
  it('is refused without a token', async () => {
    const res = await get('/api/dashboard/inference-key')
    expect(res.status).toBe(401)
  })

  it('is given to an admin, never cached', async () => {
    const res = await get('/api/dashboard/inference-key', { authorization: `Bearer ${admin}` })
    expect(res.status).toBe(200)
    expect(res.headers.get('cache-control')).toBe('no-store')
    expect(await res.json()).toEqual({ required: true, key: KEY })
  })

  // The key changes state (a request wakes a sleeping model): a read-only role must not obtain it.
  it('is refused to admin-readonly (403), and the answer holds no key', async () => {
    const res = await get('/api/dashboard/inference-key', { authorization: `Bearer ${readonly}` })
    expect(res.status).toBe(403)
    expect(await res.text()).not.toContain(KEY)
  })
})

describe('the dashboard event stream', () => {
  it('is refused without a token', async () => {
    const res = await get('/api/dashboard/events')
    expect(res.status).toBe(401)
    await res.body?.cancel()
  })

  it('stays open while nothing happens: its heartbeat comes 15 s in (Bun.serve would cut it at 10 s)', async () => {
    const res = await get('/api/dashboard/events', { authorization: `Bearer ${readonly}` })
    const reader = res.body!.getReader()
    const decoder = new TextDecoder()
    let text = ''
    let ended = false
    const pump = (async () => {
      for (;;) {
        const { value, done } = await reader.read()
        if (done) break
        text += decoder.decode(value, { stream: true })
      }
      ended = true
    })()
    try {
      await waitFor(
        'the first heartbeat of a quiet stream',
        () => {
          if (ended) throw new Error(`the stream ended: ${text}`)
          return text.includes(': heartbeat')
        },
        { timeoutMs: 30_000, pollMs: 100 },
      )
      // No error event (the time series' names, `errors_per_second`, carry the word itself).
      expect(text).not.toMatch(/^event: error/m)
    } finally {
      await reader.cancel()
      await pump.catch(() => undefined)
    }
  }, 40_000)

  it('starts with the instances, then relays a load: its status changes and its progress', async () => {
    const res = await get('/api/dashboard/events', { authorization: `Bearer ${readonly}` })
    const load = readSse<Record<string, unknown>>(res, 'a load through the dashboard stream', (ms) =>
      ms.some((m) => m.event === 'instance' && m.data.currentStatus === 'active'),
    )
    const loaded = await gw.json<{ instance_id: string }>('/api/v1/models/load', {
      method: 'POST',
      headers: { authorization: `Bearer ${admin}` },
      body: JSON.stringify({ model_path: 'facebook/opt-125m', enable_sleep_mode: true }),
    })
    expect(loaded.status).toBe(202)
    const id = loaded.body.instance_id
    const messages = await load
    expect(messages[0]).toEqual({ event: 'instances', data: { instances: [] } })
    const statuses = messages.filter((m) => m.event === 'instance').map((m) => m.data.currentStatus)
    expect(statuses).toEqual(['starting', 'active'])
    const active = messages.find((m) => m.event === 'instance' && m.data.currentStatus === 'active')!
    expect((active.data.instance as { id: string }).id).toBe(id)
    const progress = messages.filter((m) => m.event === 'progress').map((m) => m.data)
    expect(progress.length).toBeGreaterThan(1)
    expect(progress.every((p) => p.instance_id === id)).toBe(true)
    expect(progress.at(-1)).toMatchObject({ phase: 'ready', percent: 100 })
  })

  it('gives a late subscriber the current instances, and relays a sleep as an operation and a state change', async () => {
    const [instance] = (
      await gw.json<{ models: { id: string }[] }>('/api/v1/models', {
        headers: { authorization: `Bearer ${admin}` },
      })
    ).body.models
    const res = await get('/api/dashboard/events', { authorization: `Bearer ${admin}` })
    const sleep = readSse<Record<string, unknown>>(res, 'a sleep through the dashboard stream', (ms) =>
      ms.some((m) => m.event === 'operation' && m.data.running === false),
    )
    const slept = await gw.json(`/api/models/instances/${instance!.id}/sleep?level=1`, {
      method: 'POST',
      headers: { authorization: `Bearer ${admin}` },
    })
    expect(slept.status).toBe(200)
    const messages = await sleep
    expect(messages[0]!.event).toBe('instances')
    expect((messages[0]!.data.instances as { id: string }[]).map((i) => i.id)).toEqual([instance!.id])
    // Once, the last hour of the time series; its samples come every 5 s, whatever else happens.
    expect(messages.filter((m) => m.event === 'timeseries')).toHaveLength(1)
    const rest = messages.slice(1).filter((m) => !['progress', 'timeseries', 'sample'].includes(m.event))
    expect(rest.map((m) => [m.event, m.data.operation ?? m.data.currentStatus, m.data.running])).toEqual([
      ['operation', 'sleep', true],
      ['instance', 'sleeping', undefined],
      ['operation', 'sleep', false],
    ])
  })
})
