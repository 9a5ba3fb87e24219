import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Page, Response } from 'playwright-core'
import type { CatalogEntry } from '../../plugins/gateway/api.ts'
import type { ResidencySchema } from '../../plugins/gateway/residency/routes.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { browserMissing, openBrowser, screenshot, type TestBrowser, visit } from './browser.ts'

/**
 * The Catalogue page in a real headless chromium against a real gateway (simulated 2 × H100, auth
 * on): every entry drawn as GET /api/catalog answers it; an admin adds, edits and removes entries
 * through the page and the API then holds what the page sent; a refusal with its figures is shown
 * where it happened; a change made elsewhere appears live; a read-only user gets no write control.
 * Each entry's state is drawn as the residency manager's GET /api/residency says; the recent decisions
 * are checked against an answer given to the browser (a host with decisions of every kind).
 */
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-catalog-page', JWT_SECRET: 'c'.repeat(40) }
const YAML_ENTRY = 'yaml/model:1'
const WRITE_BUTTONS = /^(Edit entry|Remove entry|Save entry|Cancel)$/

const skip = browserMissing()

type Residency = typeof ResidencySchema.static

describe.skipIf(skip !== null)('the catalogue page in a browser', () => {
  let gw: TestGateway
  let browser: TestBrowser
  let page: Page
  let admin = ''
  const responses: Response[] = []
  const api = async <T>(path: string, init: RequestInit = {}) =>
    gw.json<T>(path, { ...init, headers: { authorization: `Bearer ${admin}` } })
  const catalog = async () => (await api<{ entries: CatalogEntry[] }>('/api/catalog')).body.entries
  const row = (p: Page, name: string) => p.locator(`table.catalog tr[data-entry="${name}"]`)
  const cell = (p: Page, name: string, figure: string) => row(p, name).locator(`td[data-figure="${figure}"]`)

  /** expectDrawn: every entry of the API has its row, with its source, GPUs, pin and preload. */
  async function expectDrawn(p: Page) {
    const entries = await catalog()
    await row(p, entries.at(-1)!.name).waitFor()
    expect(await p.locator('table.catalog tr[data-entry]').count()).toBe(entries.length)
    for (const e of entries) {
      expect(await row(p, e.name).getAttribute('data-source')).toBe(e.source)
      expect(await cell(p, e.name, 'gpus').textContent()).toBe(
        `${e.gpu_ids ? `GPU ${e.gpu_ids.join(', ')}` : 'any'} · TP ${e.tensor_parallel_size}`,
      )
      expect(await cell(p, e.name, 'pin').textContent()).toBe(e.pin ? 'yes' : 'no')
      expect(await cell(p, e.name, 'preload').textContent()).toBe(e.preload ? 'yes' : 'no')
    }
  }

  beforeAll(async () => {
    gw = await startGateway({
      ports: [27440, 27449],
      gpus: '2x80',
      hostEnv: AUTH,
      extraYaml: `    catalog:\n      - { name: '${YAML_ENTRY}', model_path: facebook/opt-125m, pin: true }\n`,
    })
    admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
    browser = await openBrowser()
    page = await browser.newPage()
    page.on('response', (res) => responses.push(res))
    await visit(page, gw.url, admin, '/catalog')
  }, 60_000)
  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
  })

  // The catalogue has an entry, so the residency manager runs and GET /api/residency answers: each
  // row's state is the manager's (it used to be drawn without them, when no manager answered).
  it('draws the catalogue as the API has it, with each entry’s state from the residency manager', async () => {
    await expectDrawn(page)
    expect(await page.locator('nav a:has-text("Catalogue")').count()).toBe(1)
    expect(await page.locator('table.catalog th:has-text("State")').count()).toBe(1)
    expect(await page.locator('.error').count()).toBe(0)
    expect(responses.filter((r) => r.url().endsWith('/api/residency')).map((r) => r.status())).toContain(200)
    const view = (await api<Residency>('/api/residency')).body
    for (const m of view.models) expect(await row(page, m.name).getAttribute('data-state')).toBe(m.state)
    // The YAML's entry has no write control: it is changed in the YAML.
    expect(await row(page, YAML_ENTRY).locator('button').count()).toBe(0)
    expect(await row(page, YAML_ENTRY).textContent()).toContain('changed in the YAML')
  })

  it('adds an entry from the form, then edits and removes it; the API holds what the page sent', async () => {
    const form = page.locator('form.catalog-form')
    await form.locator('input[name=name]').fill('org/added:v1')
    await form.locator('input[name=model_path]').fill('facebook/opt-350m')
    await form.locator('input[name=gpu_ids]').fill('1')
    await form.locator('input[name=max_tokens]').fill('4096')
    await form.locator('input[name=extra_args]').fill('--enforce-eager --dtype "bfloat16"')
    await form.locator('input[name=pin]').check()
    await form.locator('button:has-text("Save entry")').click()
    await row(page, 'org/added:v1').waitFor()
    const added = await api<CatalogEntry>(`/api/catalog/${encodeURIComponent('org/added:v1')}`)
    expect(added.body).toMatchObject({
      model_path: 'facebook/opt-350m',
      gpu_ids: [1],
      tensor_parallel_size: 1,
      max_tokens: 4096,
      extra_args: ['--enforce-eager', '--dtype', 'bfloat16'],
      enable_sleep_mode: true,
      pin: true,
      preload: false,
      source: 'api',
    })
    await expectDrawn(page)
    await screenshot(page, 'catalog')

    await row(page, 'org/added:v1').locator('button:has-text("Edit entry")').click()
    expect(await form.locator('input[name=name]').isDisabled()).toBe(true)
    expect(await form.locator('input[name=max_tokens]').inputValue()).toBe('4096')
    await form.locator('input[name=preload]').check()
    await form.locator('button:has-text("Save entry")').click()
    await form.locator('[role=status]:has-text("Saved org/added:v1")').waitFor()
    await cell(page, 'org/added:v1', 'preload').filter({ hasText: 'yes' }).waitFor()
    expect((await api<CatalogEntry>('/api/catalog/org/added:v1')).body).toMatchObject({
      preload: true,
      pin: true,
    })

    await row(page, 'org/added:v1').locator('button:has-text("Remove entry")').click()
    await row(page, 'org/added:v1').waitFor({ state: 'detached' })
    expect((await api('/api/catalog/org/added:v1')).status).toBe(404)
  })

  it('shows a refusal with its figures where it happened, and stores nothing', async () => {
    // Removing the entry being edited took the form back to adding one.
    const form = page.locator('form.catalog-form')
    expect(await form.locator('h3').textContent()).toBe('Add a catalogue entry')
    await form.locator('input[name=name]').fill('too-wide')
    await form.locator('input[name=model_path]').fill('big/model')
    await form.locator('input[name=tensor_parallel_size]').fill('4')
    await form.locator('button:has-text("Save entry")').click()
    const note = form.locator('.error')
    await note.waitFor()
    expect(await note.textContent()).toContain('fits no set of 4 GPUs of one kind on this host')
    expect(await note.textContent()).toContain('NVIDIA H100 80GB HBM3: 2 GPUs of 79.6 GiB each, fewer than 4')
    expect(await note.locator('.code').textContent()).toBe('CATALOG_ENTRY_TOO_LARGE')
    expect((await catalog()).map((e) => e.name)).toEqual([YAML_ENTRY])
  })

  it('shows an entry saved elsewhere at once, from the event stream', async () => {
    const r = await api('/api/catalog/live-one', {
      method: 'PUT',
      body: JSON.stringify({ model_path: 'a/b' }),
    })
    expect(r.status).toBe(201)
    await row(page, 'live-one').waitFor()
    await expectDrawn(page)
    expect((await api('/api/catalog/live-one', { method: 'DELETE' })).status).toBe(200)
    await row(page, 'live-one').waitFor({ state: 'detached' })
  })

  it('draws each entry’s state and the recent decisions from GET /api/residency when it answers', async () => {
    const fixture: Residency = {
      policy: 'cost',
      active: true,
      host_memory: { budget_gib: 256, used_gib: 41.5 },
      models: [
        {
          name: YAML_ENTRY,
          state: 'active',
          instance_id: 'opt-125m-abc123',
          pinned: true,
          evictable_now: false,
          why_not_evictable: 'pinned in the catalogue',
          last_request_at: new Date().toISOString(),
          request_rate_per_min: 12.5,
          queue_length: 2,
          footprint_gib: 71.7,
          gpu_ids: [0],
          costs: {
            wake_l1_s: 2,
            wake_l2_s: 9,
            load_s: 40,
            measured: { wake_l1: true, wake_l2: false, load: true },
          },
        },
      ],
      decisions: [
        {
          at: new Date().toISOString(),
          trigger: { model: YAML_ENTRY, need_gib: 71.7, gpu_ids: [0], kind: 'load' },
          victims: [
            {
              model: 'old-model',
              instance_id: 'old-1',
              action: 'sleep1',
              freed_gib: 70.1,
              expected_cost_s: 0.4,
            },
          ],
          rejected: [
            { model: 'busy-model', instance_id: 'busy-1', action: null, reason: 'requests in flight' },
            { model: 'big-model', instance_id: 'big-1', action: 'unload', reason: 'frees more than needed' },
          ],
          reason: 'old-model costs least to bring back',
        },
      ],
    }
    const ro = await browser.newPage()
    await ro.route('**/api/residency', (route) => route.fulfill({ json: fixture }))
    await visit(ro, gw.url, admin, '/catalog')
    const state = cell(ro, YAML_ENTRY, 'state')
    await state.waitFor()
    expect(await row(ro, YAML_ENTRY).getAttribute('data-state')).toBe('active')
    expect(await state.textContent()).toContain('opt-125m-abc123')
    expect(await state.textContent()).toContain('12.5/min · 2 queued · 71.7 GiB')
    expect(await state.getAttribute('title')).toBe('pinned in the catalogue')
    expect(await ro.locator('.residency-summary').getAttribute('data-policy')).toBe('cost')
    expect(await ro.locator('.residency-summary').textContent()).toContain('41.5 GiB of 256.0 GiB')
    const decision = ro.locator('ol.decisions li')
    expect(await decision.count()).toBe(1)
    expect(await decision.locator('[data-victim="old-model"]').textContent()).toBe(
      'old-model (old-1) slept at level 1: freed 70.1 GiB, expected cost to bring it back 0.4 s',
    )
    expect(await decision.locator('[data-rejected]').allTextContents()).toEqual([
      'passed over busy-model: requests in flight',
      'passed over big-model (unload): frees more than needed',
    ])
    expect(await decision.textContent()).toContain('old-model costs least to bring back')
    await screenshot(ro, 'catalog-residency')
    await ro.close()
  })

  it('shows a read-only user the catalogue without a write control, and no 403', async () => {
    const viewer = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
    const ro = await browser.newPage()
    const seen: Response[] = []
    ro.on('response', (r) => seen.push(r))
    await visit(ro, gw.url, viewer, '/catalog')
    await expectDrawn(ro)
    const buttons = await ro.locator('.page button').allTextContents()
    expect(buttons.filter((b) => WRITE_BUTTONS.test(b.trim()))).toEqual([])
    expect(await ro.locator('form.catalog-form').count()).toBe(0)
    expect(seen.filter((r) => r.status() === 403).map((r) => r.url())).toEqual([])
    await ro.close()
  })

  it('made no request to any host but the gateway, and none failed but the refusal it showed', () => {
    const origin = new URL(gw.url).origin
    expect(browser.requests.filter((r) => new URL(r.url()).origin !== origin).map((r) => r.url())).toEqual([])
    const failed = responses
      .filter((r) => r.status() >= 400)
      .map((r) => `${r.status()} ${new URL(r.url()).pathname}`)
    expect(failed).toEqual([
      // The refusal the page showed.
      '400 /api/catalog/too-wide',
    ])
  })
})
