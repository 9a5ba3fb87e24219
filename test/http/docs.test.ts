import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Page } from 'playwright-core'
import { DOCS_CSP } from '../../src/http/docs.ts'
import { browserMissing, openBrowser, type TestBrowser } from '../dashboard/browser.ts'
import { startHost, type TestHost } from '../support/host.ts'

/**
 * `/docs` (Swagger UI, offline) on a real host in simple mode: over a real socket, the page, its
 * assets and the OpenAPI document carry a Content-Security-Policy that allows only this origin and no
 * inline code, refuse framing (frame-ancestors and X-Frame-Options), nosniff and no Referer; in a
 * real Chromium, Swagger UI works under that policy, an authorization typed into it is never written
 * to the browser's storage, and a page of another origin cannot frame it.
 */
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-docs', JWT_SECRET: 'q'.repeat(40) }
const PATHS = [
  '/docs',
  '/docs/json',
  '/docs/assets/swagger-ui-bundle.js',
  '/docs/assets/swagger-ui.css',
  '/docs/assets/init.js',
]

let th: TestHost
beforeAll(async () => {
  th = await startHost('', [], AUTH)
})
afterAll(() => th.stop())

describe('/docs over a real socket', () => {
  it('serves the page, its assets and the document with a CSP of this origin only, no framing, nosniff, no referrer', async () => {
    for (const path of PATHS) {
      const res = await fetch(`${th.url}${path}`)
      expect({ path, status: res.status }).toEqual({ path, status: 200 })
      await res.arrayBuffer()
      expect({ path, headers: Object.fromEntries(res.headers) }).toMatchObject({
        path,
        headers: {
          'content-security-policy': DOCS_CSP,
          'x-frame-options': 'DENY',
          'x-content-type-options': 'nosniff',
          'referrer-policy': 'no-referrer',
        },
      })
    }
    for (const directive of [
      "default-src 'none'",
      "script-src 'self'",
      "connect-src 'self'",
      "frame-ancestors 'none'",
    ])
      expect(DOCS_CSP).toContain(directive)
    expect(DOCS_CSP).not.toContain('unsafe-')
  })

  it('has no inline script, style or other host in its page', async () => {
    const html = await (await fetch(`${th.url}/docs`)).text()
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/)
    expect(html).not.toMatch(/<style|\sstyle=/)
    expect(html).not.toMatch(/https?:\/\//)
  })
})

const skip = browserMissing()

describe.skipIf(skip !== null)('/docs in a browser', () => {
  let browser: TestBrowser
  let page: Page
  const refused: string[] = []

  beforeAll(async () => {
    browser = await openBrowser()
    // Every CSP violation of every page, as the page sees it.
    await browser.context.addInitScript(() => {
      document.addEventListener('securitypolicyviolation', (e) => {
        const w = window as unknown as { violations?: string[] }
        w.violations ??= []
        w.violations.push(`${e.violatedDirective} ${e.blockedURI}`)
      })
    })
    page = await browser.newPage()
    page.on('console', (m) => {
      if (m.text().includes('Content Security Policy')) refused.push(m.text())
    })
  })
  afterAll(() => browser?.close())

  const violations = (p: Page) =>
    p.evaluate(() => (window as unknown as { violations?: string[] }).violations ?? [])

  it('renders every operation under its CSP, with no violation and nothing from another host', async () => {
    await page.goto(`${th.url}/docs`)
    await page.locator('.opblock').first().waitFor()
    expect(await page.locator('.opblock-summary-path[data-path="/api/auth/me"]').count()).toBe(1)
    expect(await violations(page)).toEqual([])
    expect(refused).toEqual([])
    const origin = new URL(th.url).origin
    const elsewhere = browser.requests.map((r) => r.url()).filter((u) => !u.startsWith('data:'))
    expect(elsewhere.filter((u) => new URL(u).origin !== origin)).toEqual([])
  })

  it('keeps a JWT typed into Authorize in memory only: it authorizes "Try it out", and no storage holds it', async () => {
    const token = (await th.host.auth.issueToken('docs-user', ['admin'])).token
    await page.click('button.btn.authorize')
    const scheme = page.locator('.auth-container').filter({ hasText: 'adminJwt' })
    await scheme.locator('input[aria-label="auth-bearer-value"]').fill(token)
    await scheme.locator('button.authorize').click()
    await scheme.locator('button:has-text("Logout")').waitFor()
    await page.click('.modal-ux button.btn-done')
    // The authorization works: /api/auth/me answers 200 for docs-user from "Try it out".
    const op = page.locator('.opblock').filter({ has: page.locator('[data-path="/api/auth/me"]') })
    await op.locator('.opblock-summary').click()
    const answered = page.waitForResponse((r) => r.url() === `${th.url}/api/auth/me`)
    await op.locator('button.execute').click()
    const res = await answered
    expect(res.status()).toBe(200)
    expect(res.request().headers().authorization).toBe(`Bearer ${token}`)
    // Nothing was written where it would outlive the page.
    const stored = await page.evaluate(() => ({
      local: Object.fromEntries(Object.entries(localStorage)),
      session: Object.fromEntries(Object.entries(sessionStorage)),
    }))
    expect(JSON.stringify(stored)).not.toContain(token)
    expect(stored.local).toEqual({})
    // A reload starts unauthorized.
    await page.reload()
    await page.locator('.opblock').first().waitFor()
    await page.click('button.btn.authorize')
    expect(await page.locator('.auth-container button:has-text("Logout")').count()).toBe(0)
    expect(await violations(page)).toEqual([])
  }, 30_000)

  it('cannot be framed by a page of another origin', async () => {
    const attacker = Bun.serve({
      hostname: '127.0.0.1',
      port: 0,
      fetch: () =>
        new Response(
          `<!DOCTYPE html><iframe id="f" src="${th.url}/docs" onload="document.title='loaded'"></iframe>`,
          { headers: { 'content-type': 'text/html' } },
        ),
    })
    try {
      const p = await browser.newPage()
      const before = browser.requests.length
      await p.goto(`http://127.0.0.1:${attacker.port}/`)
      await p.waitForFunction(() => document.title === 'loaded', undefined, { timeout: 10_000 })
      const framed = p.frames().find((f) => f !== p.mainFrame())!
      // The browser refused to render it: no Swagger UI in the frame, none of its assets fetched.
      expect(await framed.locator('#swagger-ui').count()).toBe(0)
      const fetched = browser.requests.slice(before).map((r) => new URL(r.url()).pathname)
      expect(fetched).toContain('/docs')
      expect(fetched.filter((u) => u.startsWith('/docs/assets/'))).toEqual([])
      await p.close()
    } finally {
      attacker.stop(true)
    }
  })
})
