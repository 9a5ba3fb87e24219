import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Page } from 'playwright-core'
import { plugins } from '../../plugins/index.ts'
import { gatewayYaml } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { claimsOf, type Platform, type Provider, startPlatform, startProvider } from '../support/oauth.ts'
import { browserMissing, openBrowser, screenshot, type TestBrowser } from './browser.ts'

/**
 * The dashboard's OAuth login in a real browser: the page sends the browser to /api/auth/login, the
 * provider (oauth2-mock-server, which logs in whoever the test names) sends it to the callback, and
 * the callback to the page with the token in the URL fragment, which the page takes and removes. A
 * user in none of the groups ends on the access-denied page.
 */
const PORT = 18960
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

  it('logs in through the provider and lands on the dashboard, the token taken out of the URL', async () => {
    const { browser, page } = await logIn('alice')
    try {
      await page.locator('.gpu').first().waitFor()
      expect(page.url()).toBe(`${BASE}/#/`)
      expect(await page.locator('.who').textContent()).toContain('alice (admin)')
      const token = (await page.evaluate(() => sessionStorage.getItem('modelgate.token')))!
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

  it('shows a user in none of the groups the access-denied page, naming them, with a retry', async () => {
    const { browser, page } = await logIn('carol')
    try {
      await page.locator('h1:has-text("Access denied")').waitFor()
      const text = await page.locator('body').textContent()
      expect(text).toContain('service-admins')
      expect(text).toContain('service-admins-readonly')
      expect(await page.locator('a:has-text("Try again")').getAttribute('href')).toBe(
        `${BASE}/api/auth/login`,
      )
      expect(await page.evaluate(() => sessionStorage.getItem('modelgate.token'))).toBeNull()
      await screenshot(page, 'oauth-denied')
    } finally {
      await browser.close()
    }
  })
})
