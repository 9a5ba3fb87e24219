import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Page } from 'playwright-core'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'
import { browserMissing, openBrowser, screenshot, type TestBrowser, visit } from './browser.ts'

/**
 * What the dashboard draws, against what the API says, in a real headless chromium: the KV pool
 * only where the shared cache is on, a load's "Loading …" line only while it loads, one status word
 * per instance, a benchmark form whose controls keep their size, and pages that ask for no missing
 * icon. Auth on; every wait is on something the page shows or the bus says.
 */
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-dashboard-drawn', JWT_SECRET: 'd'.repeat(40) }

const skip = browserMissing()

interface GpuRow {
  gpu_index: number
  used_gb: number
  free_gb: number
  models: { instance_id: string }[]
}

async function loadActive(gw: TestGateway, token: string, body: Record<string, unknown>): Promise<string> {
  const headers = { authorization: `Bearer ${token}` }
  const r = await gw.json<{ instance_id: string }>('/api/v1/models/load', {
    method: 'POST',
    headers,
    body: JSON.stringify(body),
  })
  if (r.status !== 202) throw new Error(`load: ${r.status} ${JSON.stringify(r.body)}`)
  const id = r.body.instance_id
  await waitFor(
    `${id} active`,
    async () =>
      (await gw.json<{ model: { status: string } }>(`/api/v1/models/${id}`, { headers })).body.model
        .status === 'active',
    { timeoutMs: 30_000, wake: (n) => gw.host.bus.on('gateway.instance.status', n) },
  )
  return id
}

describe.skipIf(skip !== null)('what the dashboard draws', () => {
  let gw: TestGateway
  let browser: TestBrowser
  let page: Page
  let admin = ''
  let instanceId = ''
  const api = async <T>(path: string) =>
    (await gw.json<T>(path, { headers: { authorization: `Bearer ${admin}` } })).body

  beforeAll(async () => {
    gw = await startGateway({
      ports: [21320, 21339],
      env: { SIM_LOAD_DELAY_MS: '1500', SIM_TOKENS_PER_SEC: '150' },
      hostEnv: AUTH,
      extraYaml: '  benchmarks: {}\n',
    })
    admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
    instanceId = await loadActive(gw, admin, {
      model_path: 'facebook/opt-125m',
      gpu_ids: [0],
      enable_sleep_mode: true,
      gpu_memory_utilization: 0.3,
    })
    browser = await openBrowser()
    page = await browser.newPage()
  })
  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
  })

  it('draws no KV pool when the shared cache is off: the engine, other processes and free memory, as the API says', async () => {
    const { model } = await api<{
      model: { sharedcache_enabled: boolean; memory_baseline_by_gpu: Record<string, number> }
    }>(`/api/v1/models/${instanceId}`)
    expect(model.sharedcache_enabled).toBe(false)
    const view = await api<{ gpus: GpuRow[] }>('/api/memory/usage/multi-gpu')
    const row = view.gpus.find((g) => g.gpu_index === 0)!
    await visit(page, gw.url, admin, '/')
    const card = page.locator('.gpu[data-gpu="0"]')
    await card.locator(`.seg.instance[data-instance="${instanceId}"]`).waitFor()
    const kinds = await card.locator('.seg').evaluateAll((els) => els.map((e) => e.getAttribute('data-kind')))
    expect(kinds.filter((k) => k?.startsWith('kv'))).toEqual([])
    expect(await card.locator('.legend').textContent()).not.toContain('KV')
    expect(await page.locator('.summary').textContent()).not.toContain('KV pool')
    const gib = async (kind: string) =>
      Number(await card.locator(`.seg[data-kind="${kind}"]`).getAttribute('data-gib'))
    expect(await gib('free')).toBeCloseTo(row.free_gb, 1)
    const footprint = model.memory_baseline_by_gpu['0']!
    expect(footprint + (await gib('other').catch(() => 0))).toBeCloseTo(row.used_gb, 0)
    await screenshot(page, 'drawn-gpus-no-pool')
  }, 60_000)

  it('ends the "Loading … on port" line with the load', async () => {
    await page.evaluate(() => {
      location.hash = '/models'
    })
    await page.fill('input[name=model_path]', 'facebook/opt-125m')
    await page.uncheck('input[name=auto]')
    await page.check('input[name="gpu-1"]')
    await page.fill('input[name=gpu_memory_utilization]', '0.3')
    await page.click('form.load-form button[type=submit]')
    await page.locator('form.load-form .check').waitFor()
    await page.click('form.load-form button[type=submit]')
    const line = page.locator('form.load-form [data-loading]')
    await line.waitFor()
    const id = (await line.getAttribute('data-loading'))!
    expect(await line.textContent()).toMatch(/^Loading facebook\/opt-125m as \S+ on port \d+$/)
    // While the instance is starting the line stays; once it is active the line is gone.
    const status = (await api<{ model: { status: string } }>(`/api/v1/models/${id}`)).model.status
    expect(['starting', 'active']).toContain(status)
    await page.locator(`tr[data-instance="${id}"][data-status="active"]`).waitFor({ timeout: 30_000 })
    expect((await api<{ model: { status: string } }>(`/api/v1/models/${id}`)).model.status).toBe('active')
    await line.waitFor({ state: 'detached' })
    expect(await page.locator('form.load-form').textContent()).not.toContain('Loading')
    await screenshot(page, 'drawn-models-loaded')
  }, 40_000)

  it('says one status word for an instance, its own: no "running" beside an "active" badge after a wake', async () => {
    await page.evaluate((id) => {
      location.hash = `/models/${id}`
    }, instanceId)
    await page.locator('.logs .line').first().waitFor()
    await page.click('button:has-text("Sleep")')
    await page.locator('.instance-title .badge[data-status="sleeping"]').waitFor()
    await page.click('button:has-text("Wake")')
    await page.locator('.instance-title .badge[data-status="active"]').waitFor()
    await page.locator('.actions-card .note:has-text("Woke")').waitFor()
    const { model } = await api<{ model: { status: string } }>(`/api/v1/models/${instanceId}`)
    expect(model.status).toBe('active')
    expect(await page.locator('.instance-title .badge').textContent()).toBe(model.status)
    expect(await page.locator('.page.instance').textContent()).not.toContain('running')
  }, 20_000)

  it('keeps the benchmark form’s controls their own size: no stretched button, no select cut off', async () => {
    await page.evaluate(() => {
      location.hash = '/benchmarks'
    })
    await page.locator('form.bench-form select[name=instanceId]').first().waitFor()
    await page.click('form.bench-form button:has-text("Add scenario")')
    const remove = page.locator('form.bench-form button:has-text("Remove scenario")').first()
    await remove.waitFor()
    const add = await page.locator('form.bench-form button:has-text("Add scenario")').boundingBox()
    const box = await remove.boundingBox()
    expect(Math.abs(box!.height - add!.height)).toBeLessThanOrEqual(1)
    // Every select is as wide as its label, inside the form, and shows its chosen option whole.
    const selects = await page.locator('form.bench-form').evaluate((form) => {
      const outer = form.getBoundingClientRect()
      return [...form.querySelectorAll('select')].map((s) => {
        const r = s.getBoundingClientRect()
        const label = s.closest('label')!.getBoundingClientRect()
        const probe = document.createElement('span')
        probe.style.font = getComputedStyle(s).font
        probe.style.whiteSpace = 'pre'
        probe.textContent = s.selectedOptions[0]?.textContent ?? ''
        document.body.append(probe)
        const text = probe.getBoundingClientRect().width
        probe.remove()
        return {
          name: s.name,
          inside: r.left >= outer.left && r.right <= outer.right,
          fillsLabel: Math.abs(r.width - label.width) <= 1,
          // the text, the select's padding and its arrow
          fits: text + 24 <= r.width,
        }
      })
    })
    expect(selects.length).toBe(5)
    expect(selects.filter((s) => !s.inside || !s.fillsLabel || !s.fits)).toEqual([])
    await screenshot(page, 'drawn-bench-form')
  }, 20_000)

  it('asks for no icon it does not have: /docs and the dashboard, no 404 and no warning', async () => {
    // The browser asks for /favicon.ico by itself once a page has loaded, out of Playwright's sight:
    // the host's access log is where it shows, so each page is left until its network is idle.
    const fresh = await browser.newPage()
    const failed: string[] = []
    fresh.on('response', (r) => {
      if (r.status() >= 400) failed.push(`${r.status()} ${r.url()}`)
    })
    const logged = gw.logs.length
    for (const [path, ready] of [
      ['/docs', '.swagger-ui .information-container'],
      ['/', 'form[aria-label="Log in"]'],
    ] as const) {
      await fresh.goto(`${gw.url}${path}`)
      await fresh.locator(ready).waitFor()
      await fresh.waitForLoadState('networkidle')
      expect(await fresh.locator('link[rel=icon]').count()).toBe(1)
    }
    expect(failed).toEqual([])
    expect(gw.logs.slice(logged).filter((l) => l.includes('favicon') || / WARN /.test(l))).toEqual([])
    await fresh.close()
  }, 30_000)
})

describe.skipIf(skip !== null)('the KV pool where the shared cache is on', () => {
  const shm = mkdtempSync(join(tmpdir(), 'modelgate-shm-'))
  let gw: TestGateway
  let browser: TestBrowser

  beforeAll(async () => {
    gw = await startGateway({
      ports: [21340, 21349],
      shmDir: shm,
      hostEnv: AUTH,
      extraYaml: '    sharedcache: { enabled: true }\n',
    })
    browser = await openBrowser()
  })
  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
    rmSync(shm, { recursive: true, force: true })
  })

  it('draws the pool’s parts and its card, with the API’s figures', async () => {
    const admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
    const id = await loadActive(gw, admin, { model_path: 'facebook/opt-125m', gpu_ids: [0] })
    const view = (
      await gw.json<{ kvcache: { total_gb: number }; gpus: (GpuRow & { kvcache: { free_gb: number } })[] }>(
        '/api/memory/usage/multi-gpu',
        { headers: { authorization: `Bearer ${admin}` } },
      )
    ).body
    const page = await browser.newPage()
    await visit(page, gw.url, admin, '/')
    const card = page.locator('.gpu[data-gpu="0"]')
    await card.locator(`.seg.instance[data-instance="${id}"]`).waitFor()
    const free = view.gpus.find((g) => g.gpu_index === 0)!.kvcache.free_gb
    expect(Number(await card.locator('.seg[data-kind="kv-free"]').getAttribute('data-gib'))).toBeCloseTo(
      free,
      1,
    )
    expect(await card.locator('.legend').textContent()).toContain('KV pool free')
    expect(await page.locator('.summary').textContent()).toContain('KV pool')
    await screenshot(page, 'drawn-gpus-pool')
  }, 60_000)
})
