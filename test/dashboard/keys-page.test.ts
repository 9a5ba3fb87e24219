import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Page } from 'playwright-core'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'
import { browserMissing, openBrowser, screenshot, type TestBrowser, visit } from './browser.ts'

/**
 * The Keys page in a real headless chromium against a real gateway (a simulated engine), auth on:
 * a key created on the page shows its secret once, the copy button puts it on the clipboard and it
 * works for inference; its limits are changed on the page; its usage is drawn per model as the API
 * counts it; revoking it on the page refuses it. A read-only user sees the keys without a control.
 */
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-dashboard-keys', JWT_SECRET: 'q'.repeat(40) }
const MODEL = 'keys-page-model'

const skip = browserMissing()

describe.skipIf(skip !== null)('the Keys page in a browser', () => {
  let gw: TestGateway
  let browser: TestBrowser
  let page: Page
  let admin = ''
  const api = async <T>(path: string, init: RequestInit = {}) =>
    (await gw.json<T>(path, { ...init, headers: { authorization: `Bearer ${admin}` } })).body

  beforeAll(async () => {
    gw = await startGateway({ ports: [24330, 24339], hostEnv: AUTH, env: { SIM_TOKENS_PER_SEC: '2000' } })
    admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
    const r = await gw.json<{ instance_id: string }>('/api/v1/models/load', {
      method: 'POST',
      headers: { authorization: `Bearer ${admin}` },
      body: JSON.stringify({ model_path: 'org/keys-page', served_model_name: MODEL, gpu_ids: [0] }),
    })
    await waitFor(
      'the model active',
      async () =>
        (await api<{ model: { status: string } }>(`/api/v1/models/${r.body.instance_id}`)).model.status ===
        'active',
      { timeoutMs: 30_000, wake: (n) => gw.host.bus.on('gateway.instance.status', n) },
    )
    browser = await openBrowser()
    await browser.context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: gw.url })
    page = await browser.newPage()
    await visit(page, gw.url, admin, '/keys')
  }, 60_000)
  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
  })

  const chat = (key: string) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello' }], max_tokens: 6 }),
    })

  it('creates a key, shows its secret once with a copy button, and the key works', async () => {
    await page.locator('table.keys').waitFor()
    await page.fill('input[name=name]', 'web team')
    await page.fill('input[name=rpm]', '60')
    await page.fill('input[name=models]', MODEL)
    await page.click('button:has-text("Create key")')
    const secret = page.locator('.key-secret code[data-secret]')
    await secret.waitFor()
    const key = (await secret.textContent()) ?? ''
    expect(key).toMatch(/^mg-[A-Za-z0-9_-]{43}$/)
    await page.click('button:has-text("Copy key")')
    await page.locator('button:has-text("Copied")').waitFor()
    expect(await page.evaluate(() => navigator.clipboard.readText())).toBe(key)
    await screenshot(page, 'keys-created')
    // The row, and the key at work.
    const row = page.locator('table.keys tr[data-key="web team"]')
    await row.waitFor()
    expect(await row.locator('td[data-figure="rpm"]').textContent()).toBe('60')
    for (let i = 0; i < 3; i++) expect((await chat(key)).status).toBe(200)
    // Shown once: gone from the page when dismissed, and in no answer the page reads.
    await page.click('button:has-text("Done")')
    await secret.waitFor({ state: 'detached' })
    expect(await page.content()).not.toContain(key)
    const keys = await api<{ keys: unknown[] }>('/api/keys')
    expect(JSON.stringify(keys)).not.toContain(key)
  }, 30_000)

  it('changes a key’s limits, draws its usage per model as the API counts it, and revokes it', async () => {
    const row = page.locator('table.keys tr[data-key="web team"]')
    await row.locator('button:has-text("Edit limits")').click()
    const editing = page.locator('table.keys tr.editing')
    await editing.locator('input[name=rpm]').fill('120')
    await editing.locator('input[name=tpm]').fill('5000')
    await editing.locator('button:has-text("Save limits")').click()
    await page.locator('table.keys tr[data-key="web team"] td[data-figure="tpm"]:has-text("5,000")').waitFor()
    const { keys } = await api<{ keys: { id: string; name: string; rpm: number; tpm: number }[] }>(
      '/api/keys',
    )
    const k = keys.find((x) => x.name === 'web team')!
    expect([k.rpm, k.tpm]).toEqual([120, 5000])

    await row.locator('button:has-text("Usage")').click()
    const usage = await api<{
      rows: { prompt_tokens: number; completion_tokens: number; requests: number }[]
    }>(`/api/keys/${k.id}/usage`)
    const tokens = usage.rows.reduce((a, r) => a + r.prompt_tokens + r.completion_tokens, 0)
    await page.locator(`section[data-usage="${k.id}"] [data-figure="requests"]:has-text("3")`).waitFor()
    const chart = page.locator(`#chart-key-${k.id}`)
    await chart.waitFor()
    const drawn = await chart.evaluate((el) => {
      const u = (el as unknown as { uplot?: { data: (number | null)[][] } }).uplot
      return u
        ? u.data
            .slice(1)
            .flat()
            .reduce<number>((a, v) => a + (v ?? 0), 0)
        : -1
    })
    expect(drawn).toBe(tokens)
    await screenshot(page, 'keys-usage')

    const secretless = page.locator('table.keys tr[data-key="web team"]')
    await secretless.locator('button:has-text("Revoke key")').click()
    await secretless.waitFor({ state: 'detached' })
    expect((await api<{ keys: unknown[] }>('/api/keys')).keys).toHaveLength(0)
  }, 30_000)

  it('shows a read-only user the keys without a control that changes them', async () => {
    await api('/api/keys', { method: 'POST', body: JSON.stringify({ name: 'visible' }) })
    const viewer = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
    const ro = await browser.newPage()
    await visit(ro, gw.url, viewer, '/keys')
    await ro.locator('table.keys tr[data-key="visible"]').waitFor()
    const buttons = (await ro.locator('button').allTextContents()).map((b) => b.trim())
    expect(buttons.filter((b) => /^(Create key|Edit limits|Revoke key)$/.test(b))).toEqual([])
    expect(buttons).toContain('Usage')
    await ro.close()
  })
})
