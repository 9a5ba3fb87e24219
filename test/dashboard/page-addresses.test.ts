import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { browserMissing, openBrowser, signedIn } from './browser.ts'

/**
 * A dashboard page's address typed as a path (`/models`, as `GET /api/dashboard/pages` advertises
 * it) opens the page: the main listener answers 302 to `/#/models`, where the dashboard's fragment
 * router shows it. Only where no route serves the path: `/metrics`, `/docs`, `/api/*`, `/v1/*`,
 * `/api/health` answer as before, and nothing the admin JWT guards opens without it. Real HTTP to a real
 * gateway (auth on, the router beside it, the cluster plugin off).
 */
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-page-addresses', JWT_SECRET: 'a'.repeat(40) }
const KEY = 'sk-page-addresses'
let gw: TestGateway
let admin = ''

const get = (path: string, init: RequestInit = {}) =>
  fetch(`${gw.url}${path}`, { redirect: 'manual', ...init, signal: AbortSignal.timeout(10_000) })

beforeAll(async () => {
  gw = await startGateway({
    ports: [26210, 26219],
    hostEnv: { ...AUTH, INFERENCE_API_KEY: KEY },
    extraYaml: '  router: { host: 127.0.0.1, port: 0, from_gateway: true }\n',
  })
  admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
}, 60_000)

afterAll(async () => {
  await gw?.stop()
})

describe('a typed dashboard address', () => {
  it('redirects every advertised page path (with its parameters) to its fragment, without a token', async () => {
    const pages = await get('/api/dashboard/pages', { headers: { authorization: `Bearer ${admin}` } })
    expect(pages.status).toBe(200)
    const listed = (await pages.json()) as { pages: { path: string }[]; off: { path: string }[] }
    const concrete = (p: string) => p.replace(/:[a-z]+/g, 'x1')
    const paths = [...listed.pages, ...listed.off]
      .map((p) => concrete(p.path))
      .filter((p) => p !== '/' && p !== '/metrics')
    expect(paths).toContain('/models')
    expect(paths).toContain('/cluster') // a page of a plugin that is off: it says so at its address
    for (const p of paths) {
      const res = await get(p)
      expect([p, res.status]).toEqual([p, 302])
      expect(res.headers.get('location')).toBe(`/#${p}`)
      await res.body?.cancel()
    }
    const head = await get('/models/abc', { method: 'HEAD' })
    expect(head.status).toBe(302)
    expect(head.headers.get('location')).toBe('/#/models/abc')
  })

  it('shadows no route and weakens no guard', async () => {
    // /metrics is Prometheus's (the Metrics page opens at /#/metrics).
    const metrics = await get('/metrics', { headers: { authorization: `Bearer ${admin}` } })
    expect(metrics.status).toBe(200)
    expect(await metrics.text()).toContain('# TYPE')
    expect((await get('/metrics')).status).not.toBe(302)
    const docs = await get('/docs')
    expect(docs.status).toBe(200)
    expect(docs.headers.get('content-type')).toContain('text/html')
    await docs.body?.cancel()
    expect((await get('/api/health')).status).toBe(200)
    expect((await get('/api/health/live')).status).toBe(200)
    // The router's own listener is not the dashboard's: its routes answer as they did.
    const router = gw.host.urls.router!
    expect((await fetch(`${router}/health`)).status).toBe(200)
    const routed = await fetch(`${router}/models`, {
      redirect: 'manual',
      headers: { authorization: `Bearer ${KEY}` },
    })
    expect(routed.status).toBe(200)
    expect(((await routed.json()) as { object: string }).object).toBe('list')
    // Guarded routes stay guarded, inference keeps its key.
    expect((await get('/api/dashboard/pages')).status).toBe(401)
    expect((await get('/api/v1/models')).status).toBe(401)
    expect((await get('/v1/models')).status).toBe(401)
    // Not a page: the 404 as before; a page path but another method or shape: no redirect.
    for (const [method, path] of [
      ['GET', '/nowhere'],
      ['GET', '/health'],
      ['GET', '/models/a/b'],
      ['GET', '/api/models'],
      ['POST', '/models'],
    ] as const) {
      const res = await get(path, { method })
      expect([method, path, res.status]).toEqual([method, path, 404])
      expect(res.headers.get('location')).toBeNull()
      await res.body?.cancel()
    }
  })

  it.skipIf(browserMissing() !== null)('opens the page in a browser', async () => {
    const browser = await openBrowser()
    try {
      const page = await browser.newPage()
      await signedIn(page, gw.url, admin)
      await page.locator('nav').waitFor()
      await page.goto(`${gw.url}/catalog`)
      expect(page.url()).toBe(`${gw.url}/#/catalog`)
      await page.locator('nav a.active:has-text("Catalogue")').waitFor()
    } finally {
      await browser.close()
    }
  })
})
