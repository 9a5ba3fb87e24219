import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Page } from 'playwright-core'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import {
  browserMissing,
  expectLinkRefused,
  openBrowser,
  screenshot,
  signedIn,
  type TestBrowser,
} from './browser.ts'

/**
 * The dashboard in a real headless chromium against a real gateway (simulated GPUs and engine) in
 * simple mode with an inference key: an admin logs in, loads a model from the form, watches it load
 * and its GPU bar grow, chats with it, sleeps and wakes it, and logs out; a read-only user sees no
 * write control and meets no 403; no page ever asks anything of another host. Every wait is on
 * something the page shows. Screenshots (1400×900) go to test/dashboard/output/.
 */
const KEY = 'sk-dashboard-browser-key'
const PASSWORD = 'pw-dashboard-browser'
const MODEL = 'Qwen/Qwen2.5-1.5B-Instruct'
const WRITE_BUTTONS =
  /^(Check memory|Load model|Load anyway|Sleep|Wake|Unload|Confirm unload|Move|Cancel move|Force completion)$/

const skip = browserMissing()

describe.skipIf(skip !== null)('the dashboard in a browser', () => {
  let gw: TestGateway
  let browser: TestBrowser
  let page: Page
  let instanceId = ''
  const usedBefore = new Map<number, number>()

  beforeAll(async () => {
    gw = await startGateway({
      ports: [18920, 18939],
      // A load slow enough for its progress to be seen, a stream slow enough to arrive in pieces.
      env: { SIM_LOAD_DELAY_MS: '2500', SIM_TOKENS_PER_SEC: '60' },
      hostEnv: {
        AUTH_MODE: 'simple',
        ADMIN_PASSWORD: PASSWORD,
        JWT_SECRET: 'b'.repeat(40),
        INFERENCE_API_KEY: KEY,
      },
    })
    browser = await openBrowser()
    page = await browser.newPage()
  })
  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
  })

  const adminApi = async <T>(path: string) => {
    const token = (await gw.host.auth.issueToken('test', ['admin'])).token
    return (await gw.json<T>(path, { headers: { authorization: `Bearer ${token}` } })).body
  }
  const gpuUsed = (p: Page, gpu: number) =>
    p
      .locator(`.gpu[data-gpu="${gpu}"]`)
      .getAttribute('data-used-gib')
      .then((v) => Number(v))

  it('shows the login form, the server’s refusal next to it, then every GPU once logged in', async () => {
    await page.goto(`${gw.url}/`)
    await page.fill('input[name=password]', 'not-the-password')
    await page.click('form[aria-label="Log in"] button[type=submit]')
    await expect(page.locator('form[aria-label="Log in"] .error').textContent()).resolves.toContain(
      'Invalid username or password',
    )
    await screenshot(page, 'login')
    await page.fill('input[name=password]', PASSWORD)
    await page.click('form[aria-label="Log in"] button[type=submit]')
    await page.locator('.gpu').nth(1).waitFor()
    expect(await page.locator('.gpu').count()).toBe(2)
    await page.locator('.conn.live').waitFor()
    for (const g of [0, 1]) usedBefore.set(g, await gpuUsed(page, g))
    expect(await page.evaluate(() => sessionStorage.getItem('modelgate.token'))).toMatch(/^ey/)
  })

  it('loads a model from the form: the pre-load check first, then a progress bar, then active', async () => {
    await page.click('nav a:has-text("Models")')
    await page.fill('input[name=model_path]', MODEL)
    await page.click('form.load-form button[type=submit]')
    const verdict = page.locator('form.load-form .check')
    await verdict.waitFor()
    // No memory profile yet: the engine's claim (0.9 × 80 GB) against an empty GPU: tight, not refused.
    expect(await verdict.getAttribute('data-level')).toBe('caution')
    expect(await verdict.textContent()).toContain('free on the least free target')
    expect(await verdict.textContent()).toMatch(/needs per GPU\s*7\d\.\d+ GiB/)
    await screenshot(page, 'models-check')
    // Every value the instance's progress bar shows, recorded by the page itself as it renders.
    await page.evaluate(() => {
      const seen: number[] = []
      ;(window as unknown as { progressSeen: number[] }).progressSeen = seen
      new MutationObserver(() => {
        for (const bar of document.querySelectorAll('table.instances [role=progressbar]'))
          seen.push(Number(bar.getAttribute('aria-valuenow')))
      }).observe(document.body, { subtree: true, childList: true, attributes: true })
    })
    expect(await page.textContent('form.load-form button[type=submit]')).toBe('Load model')
    await page.click('form.load-form button[type=submit]')
    const row = page.locator('table.instances tr[data-instance]')
    await row.waitFor()
    instanceId = (await row.getAttribute('data-instance'))!
    await page.locator('table.instances [role=progressbar]').waitFor()
    await screenshot(page, 'models-loading')
    await page.locator(`tr[data-instance="${instanceId}"][data-status="active"]`).waitFor({ timeout: 30_000 })
    const seen = await page.evaluate(() => (window as unknown as { progressSeen: number[] }).progressSeen)
    expect(seen.length).toBeGreaterThan(1)
    expect(Math.max(...seen)).toBeGreaterThan(Math.min(...seen))
    expect(await page.locator('table.instances [role=progressbar]').count()).toBe(0)
    await screenshot(page, 'models')
  })

  it("grows the GPU's bar by the engine's footprint, with the figures on hover", async () => {
    const { model } = await adminApi<{
      model: { gpu_ids: number[]; memory_baseline_by_gpu: Record<string, number> }
    }>(`/api/v1/models/${instanceId}`)
    const gpu = model.gpu_ids[0]!
    const footprint = model.memory_baseline_by_gpu[String(gpu)]!
    expect(footprint).toBeGreaterThan(1)
    await page.click('nav a:has-text("GPUs")')
    const segment = page.locator(`.gpu[data-gpu="${gpu}"] .seg.instance[data-instance="${instanceId}"]`)
    await segment.waitFor()
    expect(Number(await segment.getAttribute('data-gib'))).toBeCloseTo(footprint, 2)
    expect(await gpuUsed(page, gpu)).toBeCloseTo(usedBefore.get(gpu)! + footprint, 1)
    const width = await segment.evaluate((el) => el.getBoundingClientRect().width)
    const bar = await page.locator(`.gpu[data-gpu="${gpu}"] .bar`).evaluate((el) => el.clientWidth)
    const total = Number(await page.locator(`.gpu[data-gpu="${gpu}"]`).getAttribute('data-total-gib'))
    expect(width / bar).toBeCloseTo(footprint / total, 1)
    await segment.hover()
    const detail = await page.locator(`.gpu[data-gpu="${gpu}"] .bar-detail`).textContent()
    expect(detail).toContain(`${footprint.toFixed(2)} GiB`)
    expect(detail).toContain('weights and CUDA graphs')
    await screenshot(page, 'gpus')
  })

  it('chats with the model in a stream through /v1 with the inference key, showing TTFT and tokens/s', async () => {
    // A catalogued model not loaded is offered too (a chat with it loads it), as /v1/models lists it.
    const token = (await gw.host.auth.issueToken('test', ['admin'])).token
    const saved = await fetch(`${gw.url}/api/catalog/on-demand`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model_path: 'org/on-demand-7b', gpu_memory_utilization: 0.2 }),
    })
    expect(saved.status).toBe(201)
    await page.click('nav a:has-text("Chat")')
    await page.locator('select[name=model] option[value="on-demand"][data-state="unloaded"]').waitFor({
      state: 'attached',
    })
    expect(await page.locator('select[name=model] option').allTextContents()).toContain(
      'on-demand (unloaded)',
    )
    // The active model is the one chosen.
    expect(
      await page
        .locator('select[name=model]')
        .evaluate((el) => (el as HTMLSelectElement).selectedOptions[0]?.dataset.state),
    ).toBe('active')
    await page.fill('textarea[name=message]', 'Tell me about GPUs')
    await page.evaluate(() => {
      const w = window as unknown as { contentChanges: number }
      w.contentChanges = 0
      new MutationObserver(() => {
        w.contentChanges++
      }).observe(document.querySelector('.transcript')!, {
        subtree: true,
        characterData: true,
        childList: true,
      })
    })
    await page.click('form.chat-input button[type=submit]')
    const stats = page.locator('.turn.assistant .chat-stats')
    await page.waitForFunction(() =>
      /· (stop|length)$/.test(document.querySelector('.turn.assistant .chat-stats')?.textContent ?? ''),
    )
    const text = await page.locator('.turn.assistant .content').textContent()
    expect(text!.trim().length).toBeGreaterThan(10)
    expect(
      await page.evaluate(() => (window as unknown as { contentChanges: number }).contentChanges),
    ).toBeGreaterThan(3)
    expect(await stats.locator('[data-stat=ttft]').textContent()).toMatch(/^TTFT \d+(\.\d+)? (ms|s)$/)
    expect(await stats.locator('[data-stat=tps]').textContent()).toMatch(/^\d+\.\d tokens\/s$/)
    const chat = browser.requests.find((r) => r.url().endsWith('/v1/chat/completions'))!
    expect(chat.headers()['authorization']).toBe(`Bearer ${KEY}`)
    expect(await page.content()).not.toContain(KEY)
    expect(page.url()).not.toContain(KEY)
    expect(browser.requests.some((r) => r.url().includes(KEY))).toBe(false)
    expect(await page.evaluate(() => JSON.stringify({ ...sessionStorage, ...localStorage }))).not.toContain(
      KEY,
    )
    await screenshot(page, 'chat')
  })

  it('sleeps the model and wakes it from its page', async () => {
    await page.click('nav a:has-text("Models")')
    await page.click(`tr[data-instance="${instanceId}"] a`)
    const badge = page.locator('.instance-title .badge')
    await page.locator('.logs .line').first().waitFor()
    await page.selectOption('select[name=sleep-level]', '1')
    await page.click('button:has-text("Sleep")')
    await page.locator('.instance-title .badge[data-status="sleeping"]').waitFor()
    expect(await page.locator('.actions-card .note').textContent()).toContain('Asleep at level 1')
    await page.click('button:has-text("Wake")')
    await page.locator('.instance-title .badge[data-status="active"]').waitFor()
    expect(await badge.textContent()).toBe('active')
    await screenshot(page, 'instance')
  })

  it('moves the model to the other GPU, following the move through its phases', async () => {
    const { model } = await adminApi<{ model: { gpu_ids: number[] } }>(`/api/v1/models/${instanceId}`)
    const target = model.gpu_ids[0] === 0 ? 1 : 0
    await page.check(`input[name="move-gpu-${target}"]`)
    await page.click('.move-card button:has-text("Move")')
    await page.locator('.move').waitFor()
    // Every phase the page shows, recorded by the page as it renders them (the panel is drawn anew
    // once the source is gone, so the whole page is watched).
    await page.evaluate(() => {
      const phase = () => document.querySelector('.move')?.getAttribute('data-phase') ?? null
      const seen: string[] = [phase()!]
      ;(window as unknown as { movePhases: string[] }).movePhases = seen
      new MutationObserver(() => {
        const now = phase()
        if (now && now !== seen.at(-1)) seen.push(now)
      }).observe(document.body, { subtree: true, childList: true, attributes: true })
    })
    await page.locator('.move[data-phase="completed"]').waitFor({ timeout: 30_000 })
    const phases = await page.evaluate(() => (window as unknown as { movePhases: string[] }).movePhases)
    expect(phases.at(-1)).toBe('completed')
    expect(new Set(phases).size).toBeGreaterThan(2)
    const link = page.locator('.move a')
    await link.waitFor()
    const moved = (await link.textContent())!
    expect(moved).not.toBe(instanceId)
    await screenshot(page, 'instance-moved')
    await link.click()
    await page.locator(`.instance[data-instance="${moved}"] .badge[data-status="active"]`).waitFor()
    instanceId = moved
    await page.click('nav a:has-text("GPUs")')
    await page.locator(`.gpu[data-gpu="${target}"] .seg.instance[data-instance="${moved}"]`).waitFor()
  })

  it("warns of a load that will not fit (danger) and shows the server's refusal next to the form", async () => {
    const { model } = await adminApi<{ model: { gpu_ids: number[] } }>(`/api/v1/models/${instanceId}`)
    const full = model.gpu_ids[0]!
    await page.click('nav a:has-text("Models")')
    await page.fill('input[name=model_path]', MODEL)
    await page.uncheck('input[name=auto]')
    await page.check(`input[name="gpu-${full}"]`)
    await page.click('form.load-form button[type=submit]')
    const verdict = page.locator('form.load-form .check[data-level="danger"]')
    await verdict.waitFor()
    expect(await verdict.textContent()).toContain('needs per GPU')
    expect(await page.textContent('form.load-form button[type=submit]')).toBe('Load anyway')
    await page.click('form.load-form button[type=submit]')
    const error = page.locator('form.load-form .error')
    await error.waitFor()
    expect(await error.locator('.code').textContent()).toBe('INSUFFICIENT_MEMORY')
    expect(await error.textContent()).toContain(`GPU ${full}`)
    await screenshot(page, 'models-refused')
    expect(await page.locator('table.instances tr[data-instance]').count()).toBe(1)
  })

  it('made no request to any host but the gateway', () => {
    const origin = new URL(gw.url).origin
    const elsewhere = browser.requests
      .map((r) => r.url())
      .filter((u) => !u.startsWith('data:') && new URL(u).origin !== origin)
    expect(browser.requests.length).toBeGreaterThan(10)
    expect(elsewhere).toEqual([])
  })

  it('logs out: the login form again, the token forgotten and revoked', async () => {
    const token = await page.evaluate(() => sessionStorage.getItem('modelgate.token'))
    await page.click('header button:has-text("Log out")')
    await page.locator('form[aria-label="Log in"]').waitFor()
    expect(await page.evaluate(() => sessionStorage.getItem('modelgate.token'))).toBeNull()
    const res = await fetch(`${gw.url}/api/auth/me`, { headers: { authorization: `Bearer ${token}` } })
    expect(res.status).toBe(401)
  })

  describe('a read-only user (admin-readonly)', () => {
    let viewer: TestBrowser
    let p: Page
    const forbidden: string[] = []

    beforeAll(async () => {
      viewer = await openBrowser()
      p = await viewer.newPage()
      p.on('response', (r) => {
        if (r.status() === 403) forbidden.push(`${r.request().method()} ${r.url()}`)
      })
    })
    afterAll(() => viewer?.close())

    const writeControls = () => p.locator('button').filter({ hasText: WRITE_BUTTONS }).count()

    it('is not signed in by a link with a valid token in its fragment (simple mode never uses it), which leaves the URL', async () => {
      const token = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
      await p.goto(`${gw.url}/#token=${token}&token_type=Bearer&expires_in=3600`)
      await expectLinkRefused(viewer, p, gw.url, token)
    })

    it('arrives signed in as a login leaves the tab (the token in its sessionStorage)', async () => {
      const token = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
      await signedIn(p, gw.url, token)
      await p.locator('.gpu').first().waitFor()
      expect(await p.locator('.who').textContent()).toContain('read-only')
    })

    it('sees every page without a write control, and meets no 403', async () => {
      expect(await writeControls()).toBe(0)
      await p.click('nav a:has-text("Models")')
      await p.locator(`tr[data-instance="${instanceId}"][data-status="active"]`).waitFor()
      expect(await p.locator('form.load-form').count()).toBe(0)
      expect(await writeControls()).toBe(0)
      await screenshot(p, 'readonly-models')
      await p.click(`tr[data-instance="${instanceId}"] a`)
      await p.locator('.logs .line').first().waitFor()
      expect(await p.locator('.actions-card, .move-card').count()).toBe(0)
      expect(await writeControls()).toBe(0)
      // No chat for a read-only user: it would need the inference key, which changes state.
      await p.click('nav a:has-text("Chat")')
      await p.locator('.chat-readonly').waitFor()
      expect(await p.locator('form.chat-input, textarea[name=message]').count()).toBe(0)
      expect(await writeControls()).toBe(0)
      expect(forbidden).toEqual([])
      expect(viewer.requests.some((r) => r.url().endsWith('/api/dashboard/inference-key'))).toBe(false)
    })

    it('made no request to any host but the gateway', () => {
      const origin = new URL(gw.url).origin
      expect(viewer.requests.filter((r) => new URL(r.url()).origin !== origin).map((r) => r.url())).toEqual(
        [],
      )
    })
  })

  it('shows the access-denied page to a user with neither role, naming the roles and offering a retry', async () => {
    const other = await openBrowser()
    try {
      const p = await other.newPage()
      const token = (await gw.host.auth.issueToken('stranger', [])).token
      await signedIn(p, gw.url, token)
      const denied = p.locator('[data-view=denied]')
      await denied.waitFor()
      expect(await denied.textContent()).toContain('admin-readonly')
      await p.click('button:has-text("Try again")')
      await p.locator('form[aria-label="Log in"]').waitFor()
      await screenshot(p, 'login-after-denied')
    } finally {
      await other.close()
    }
  })
})
