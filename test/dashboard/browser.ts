import { expect } from 'bun:test'
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { type BrowserContext, chromium, type Page, type Request } from 'playwright-core'

/**
 * The browser the dashboard tests drive: Debian's chromium (CHROMIUM_PATH overrides), headless,
 * through playwright-core, with a fresh profile each time and every request the pages make recorded.
 * Without the browser the tests are skipped with a message, except under CI (`CI` set), where a
 * missing browser fails the run: .ci/run installs it.
 */
export const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium'
export const OUTPUT = join(import.meta.dir, 'output')
export const VIEWPORT = { width: 1400, height: 900 }

const ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]

/** browserMissing: why the browser tests cannot run here, or null when they can. Throws under CI. */
export function browserMissing(): string | null {
  if (existsSync(CHROMIUM)) return null
  const why = `no chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)`
  if (process.env.CI) throw new Error(`the dashboard's browser tests need a browser under CI: ${why}`)
  console.warn(`skipping the dashboard's browser tests: ${why}`)
  return why
}

export interface TestBrowser {
  context: BrowserContext
  /** requests: every request any page of the context made, in order. */
  requests: Request[]
  newPage(): Promise<Page>
  close(): Promise<void>
}

export async function openBrowser(): Promise<TestBrowser> {
  const profile = mkdtempSync(join(tmpdir(), 'modelgate-chromium-'))
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ARGS,
    viewport: VIEWPORT,
  })
  const requests: Request[] = []
  context.on('request', (r) => requests.push(r))
  return {
    context,
    requests,
    newPage: () => context.newPage(),
    async close() {
      await context.close()
      rmSync(profile, { recursive: true, force: true })
    },
  }
}

/**
 * signedIn opens the dashboard at `url` in `page` as the holder of `token`, the way a finished login
 * leaves the tab: the token in the tab's sessionStorage (a link with the token in its fragment no
 * longer signs anyone in). The token is put there from a page of the same origin that runs no
 * dashboard code (`/api/health`).
 */
export async function signedIn(page: Page, url: string, token: string, path = '/'): Promise<void> {
  await page.goto(`${url}/api/health`)
  await page.evaluate((t) => sessionStorage.setItem('modelgate.token', t), token)
  await page.goto(`${url}/#${path}`)
}

/** visit: the dashboard page at `path` (a fragment route) as the holder of `token`, signed in as a login leaves the tab. */
export async function visit(page: Page, url: string, token: string, path: string): Promise<void> {
  await signedIn(page, url, token)
  await page.locator('nav').waitFor()
  await page.evaluate((p) => {
    location.hash = p
  }, path)
}

/**
 * expectLinkRefused: after `page` opened a dashboard link carrying `token` in its fragment, the page
 * is at its login (whichever it ends on, the login or a signed-in dashboard, is waited for), says the
 * link was ignored, has taken the fragment out of the address bar, holds no token, and no request of
 * `browser` ever carried `token`.
 */
export async function expectLinkRefused(browser: TestBrowser, page: Page, url: string, token: string) {
  await page.locator('main.login, .who').first().waitFor()
  expect(await page.locator('.who').count()).toBe(0)
  expect(await page.locator('main.login .note').textContent()).toContain('did not ask for was ignored')
  expect(page.url()).toBe(`${url}/#/`)
  expect(await page.evaluate(() => sessionStorage.getItem('modelgate.token'))).toBeNull()
  const carried = browser.requests.filter(
    (r) => r.url().includes(token) || (r.headers().authorization ?? '').includes(token),
  )
  expect(carried.map((r) => r.url())).toEqual([])
}

/** screenshot writes `<name>.png` of the page (1400×900) under test/dashboard/output/. */
export async function screenshot(page: Page, name: string): Promise<string> {
  mkdirSync(OUTPUT, { recursive: true })
  const path = join(OUTPUT, `${name}.png`)
  await page.screenshot({ path })
  return path
}
