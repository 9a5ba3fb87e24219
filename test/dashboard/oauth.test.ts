import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Page } from 'playwright-core'
import { plugins } from '../../plugins/index.ts'
import { freePort } from '../sim/helpers.ts'
import { gatewayYaml } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { claimsOf, type Platform, type Provider, startPlatform, startProvider } from '../support/oauth.ts'
import { browserMissing, expectLinkRefused, openBrowser, screenshot, type TestBrowser } from './browser.ts'

/**
 * The dashboard's OAuth login in a real browser: the page keeps a login nonce in the tab and sends
 * the browser to /api/auth/login with it, the provider (oauth2-mock-server, which logs in whoever the
 * test names) sends it to the callback, and the callback to the page with the token and the nonce in
 * the URL fragment, which the page takes (the nonce being its own) and removes. A link carrying a
 * token the tab did not ask for signs nobody in. A user in none of the groups ends on the
 * access-denied page, whose retry keeps the tab's nonce.
 */
/** The listener: a free port, so a second copy of the suite beside this one never meets it. */
const PORT = await freePort()
const BASE = `http://127.0.0.1:${PORT}`
const USERS = {
  alice: { uid: 'uid-alice', groups: ['system:authenticated', 'service-admins'] },
  carol: { uid: 'uid-carol', groups: ['developers'] },
}

const skip = browserMissing()

describe.skipIf(skip !== null)('the dashboard in OAuth mode, in a browser', () => {
  let provider: Provider
  let platform: Platform
  let host: TestHost
  let simDir: string

  beforeAll(async () => {
    provider = await startProvider('rfc8414')
    platform = await startPlatform(USERS)
    simDir = mkdtempSync(join(tmpdir(), 'modelgate-dash-oauth-'))
    host = await startHost(
      gatewayYaml({ ports: [18961, 18969] }, simDir),
      plugins,
      {
        AUTH_MODE: 'oauth',
        JWT_SECRET: 'o'.repeat(40),
        OAUTH_ISSUER_URL: provider.issuer,
        OAUTH_CLIENT_ID: 'modelgate',
        OAUTH_CLIENT_SECRET: 'client-secret',
        K8S_API_URL: platform.url,
        API_BASE_URL: BASE,
      },
      undefined,
      { server: { port: PORT } },
    )
  })
  afterAll(async () => {
    await host?.stop()
    await platform?.stop()
    await provider?.stop()
    rmSync(simDir, { recursive: true, force: true })
  })

  /** logIn opens the page in a fresh browser as `user` and presses the login button. */
  async function logIn(user: keyof typeof USERS): Promise<{ browser: TestBrowser; page: Page }> {
    provider.user = user
    const browser = await openBrowser()
    const page = await browser.newPage()
    await page.goto(`${BASE}/`)
    await page.click('main.login button:has-text("Log in")')
    return { browser, page }
  }

  /** aliceJwt: a valid JWT of alice's, as an OAuth login issues it (someone else's, to the tab). */
  const aliceJwt = async () =>
    (await host.host.auth.issueOAuthToken({ sub: 'uid-alice', username: 'alice', roles: ['admin'] })).token

  it('logs in through the provider and lands on the dashboard, the token taken out of the URL', async () => {
    const { browser, page } = await logIn('alice')
    try {
      await page.locator('.gpu').first().waitFor()
      expect(page.url()).toBe(`${BASE}/#/`)
      expect(await page.locator('.who').textContent()).toContain('alice (admin)')
      const token = (await page.evaluate(() => sessionStorage.getItem('modelgate.token')))!
      // The nonce went out with the login, came back with the token, and is used up.
      const started = browser.requests.find((r) => r.url().startsWith(`${BASE}/api/auth/login`))!
      expect(new URL(started.url()).searchParams.get('nonce')).toMatch(/^[A-Za-z0-9_-]{43}$/)
      expect(await page.evaluate(() => sessionStorage.getItem('modelgate.login-nonce'))).toBeNull()
      expect(claimsOf(token)).toMatchObject({ sub: 'uid-alice', roles: ['admin'], authMode: 'oauth' })
      // The fragment reached the page (from the callback's redirect) and left the address bar.
      const landed = browser.requests.find((r) => r.url().startsWith(`${BASE}/api/auth/callback`))
      expect(landed).toBeDefined()
      expect(browser.requests.filter((r) => r.url().includes('token=')).map((r) => r.url())).toEqual([])
      await screenshot(page, 'oauth-logged-in')
    } finally {
      await browser.close()
    }
  })

  it("does not sign a new tab in from a link carrying someone else's valid token", async () => {
    const aliceToken = await aliceJwt()
    const browser = await openBrowser()
    try {
      const page = await browser.newPage()
      await page.goto(
        `${BASE}/#token=${aliceToken}&token_type=Bearer&expires_in=3600&nonce=${'g'.repeat(43)}`,
      )
      await expectLinkRefused(browser, page, BASE, aliceToken)
      await screenshot(page, 'oauth-foreign-link')
    } finally {
      await browser.close()
    }
  }, 20_000)

  it('does not take a token whose nonce is not the one its own login under way kept, and uses that nonce up', async () => {
    const aliceToken = await aliceJwt()
    const browser = await openBrowser()
    try {
      const page = await browser.newPage()
      await page.goto(`${BASE}/api/health`)
      await page.evaluate(() => sessionStorage.setItem('modelgate.login-nonce', 'k'.repeat(43)))
      await page.goto(
        `${BASE}/#token=${aliceToken}&token_type=Bearer&expires_in=3600&nonce=${'g'.repeat(43)}`,
      )
      await expectLinkRefused(browser, page, BASE, aliceToken)
      expect(await page.evaluate(() => sessionStorage.getItem('modelgate.login-nonce'))).toBeNull()
      // Not even the right nonce now: it was used up by the refusal.
      await page.goto(`${BASE}/api/health`)
      await page.goto(`${BASE}/#token=${aliceToken}&nonce=${'k'.repeat(43)}`)
      await expectLinkRefused(browser, page, BASE, aliceToken)
    } finally {
      await browser.close()
    }
  }, 20_000)

  it('shows a user in none of the groups the access-denied page, naming them, with a retry that logs in once added', async () => {
    const { browser, page } = await logIn('carol')
    const groups = USERS.carol.groups
    try {
      await page.locator('h1:has-text("Access denied")').waitFor()
      const text = await page.locator('body').textContent()
      expect(text).toContain('service-admins')
      expect(text).toContain('service-admins-readonly')
      // The retry goes through the login again with this tab's nonce, still kept.
      const kept = await page.evaluate(() => sessionStorage.getItem('modelgate.login-nonce'))
      expect(kept).toMatch(/^[A-Za-z0-9_-]{43}$/)
      expect(await page.locator('a:has-text("Try again")').getAttribute('href')).toBe(
        `${BASE}/api/auth/login?nonce=${kept}`,
      )
      expect(await page.evaluate(() => sessionStorage.getItem('modelgate.token'))).toBeNull()
      // The page's one style block applies under its CSP (allowed by its hash, no 'unsafe-inline').
      expect(
        await page.locator('a:has-text("Try again")').evaluate((a) => getComputedStyle(a).backgroundColor),
      ).toBe('rgb(36, 87, 197)')
      await screenshot(page, 'oauth-denied')
      USERS.carol.groups = [...groups, 'service-admins-readonly']
      await page.click('a:has-text("Try again")')
      await page.locator('.gpu').first().waitFor()
      expect(await page.locator('.who').textContent()).toContain('carol')
      expect(await page.locator('.who').textContent()).toContain('read-only')
    } finally {
      USERS.carol.groups = groups
      await browser.close()
    }
  }, 20_000)
})
