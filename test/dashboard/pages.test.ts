import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Page, Response } from 'playwright-core'
import type { BenchmarkRun } from '../../plugins/benchmarks/schemas.ts'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { startStaticPods } from '../support/pods.ts'
import { waitFor } from '../support/wait.ts'
import { browserMissing, openBrowser, screenshot, type TestBrowser, visit } from './browser.ts'

/**
 * The dashboard's benchmark, preset and profile pages, and the cluster page, in a real headless
 * chromium against real gateways (simulated GPUs and engines), auth on. The figures the pages show
 * are compared with what the API answers; every wait is on something the page shows.
 */
const KEY = 'sk-dashboard-pages-key'
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-dashboard-pages', JWT_SECRET: 'p'.repeat(40) }
const WRITE_BUTTONS =
  /^(Start benchmark|Save preset|Load preset|Delete preset|Delete profile|Load model|Sleep|Wake|Unload|Move)$/

const skip = browserMissing()

describe.skipIf(skip !== null)('benchmarks, presets and profiles in a browser', () => {
  let gw: TestGateway
  let browser: TestBrowser
  let page: Page
  let admin = ''
  let instanceId = ''
  const responses: Response[] = []
  const api = async <T>(path: string, init: RequestInit = {}) =>
    (await gw.json<T>(path, { ...init, headers: { authorization: `Bearer ${admin}` } })).body

  beforeAll(async () => {
    gw = await startGateway({
      ports: [21200, 21219],
      env: { SIM_LOAD_DELAY_MS: '1500', SIM_TOKENS_PER_SEC: '150', SIM_TTFT_MS: '20' },
      hostEnv: { ...AUTH, INFERENCE_API_KEY: KEY },
      extraYaml: '  benchmarks: { progress_interval_ms: 100 }\n',
    })
    admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
    instanceId = await gw.load(
      { model_path: 'facebook/opt-125m', gpu_ids: [0], gpu_memory_utilization: 0.3 },
      admin,
    )
    await gw.waitStatus(instanceId, 'active', 30_000, admin)
    browser = await openBrowser()
    page = await browser.newPage()
    page.on('response', (res) => responses.push(res))
    await visit(page, gw.url, admin, '/benchmarks')
  }, 60_000)
  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
  })

  const chartValues = (p: Page, chart: string, scope = '') =>
    p
      .locator(`${scope} [data-chart="${chart}"] rect[data-bar]`.trim())
      .evaluateAll((els) => els.map((e): number | null => Number(e.getAttribute('data-value'))))

  it('starts a run from the page, shows its progress live, then its charts with the figures the API has', async () => {
    await page.locator('form.bench-form').waitFor()
    await page.fill('form.bench-form input[name=name]', 'first run')
    const first = page.locator('form.bench-form [data-scenario-form="0"]')
    await first.locator('input[name=totalRequests]').fill('24')
    await first.locator('input[name=concurrency]').fill('2')
    await first.locator('input[name=outputTokens]').fill('24')
    await first.locator('input[name=warmupRequests]').fill('0')
    // A second scenario: a copy of the first at concurrency 1.
    await page.click('form.bench-form button:has-text("Add scenario")')
    await page.locator('form.bench-form [data-scenario-form="1"] input[name=concurrency]').fill('1')
    await page.evaluate(() => {
      const seen: number[] = []
      ;(window as unknown as { seen: number[] }).seen = seen
      new MutationObserver(() => {
        for (const bar of document.querySelectorAll('.scenario [role=progressbar]'))
          seen.push(Number(bar.getAttribute('aria-valuenow')))
      }).observe(document.body, { subtree: true, childList: true, attributes: true })
    })
    await page.click('form.bench-form button[type=submit]')
    await page.locator('.scenario [role=progressbar]').first().waitFor()
    await screenshot(page, 'benchmark-running')
    const run = page.locator('[data-run][data-status="completed"]')
    await run.waitFor({ timeout: 30_000 })
    const id = (await run.getAttribute('data-run'))!
    const seen = await page.evaluate(() => (window as unknown as { seen: number[] }).seen)
    expect(seen.length).toBeGreaterThan(1)
    expect(Math.max(...seen)).toBeGreaterThan(Math.min(...seen))
    const { benchmark } = await api<{ benchmark: BenchmarkRun }>(`/api/benchmarks/${id}`)
    expect(benchmark.scenarios.map((x) => [x.concurrency, x.total_requests, x.output_tokens])).toEqual([
      [2, 24, 24],
      [1, 24, 24],
    ])
    expect(await page.locator('.scenario [data-chart="e2e"]').count()).toBe(2)
    const m = benchmark.scenarios[0]!.metrics!
    expect(m.successful_requests).toBe(24)
    await page.locator('[data-chart="ttft"] rect[data-bar]').first().waitFor()
    const one = `[data-scenario="${benchmark.scenarios[0]!.id}"]`
    expect(await chartValues(page, 'ttft', one)).toEqual([m.ttft_p50, m.ttft_p90, m.ttft_p99])
    expect(await chartValues(page, 'tpot', one)).toEqual([m.tpot_p50, m.tpot_p90, m.tpot_p99])
    expect(await chartValues(page, 'e2e', one)).toEqual([m.e2e_p50, m.e2e_p90, m.e2e_p99])
    expect(await chartValues(page, 'goodput', one)).toEqual([m.goodput_percent])
    const m2 = benchmark.scenarios[1]!.metrics!
    const two = `[data-scenario="${benchmark.scenarios[1]!.id}"]`
    expect(await chartValues(page, 'e2e', two)).toEqual([m2.e2e_p50, m2.e2e_p90, m2.e2e_p99])
    // Drawn to scale from 0: each bar's rendered height over the tallest is its value over the largest.
    const heights = await page
      .locator(`${one} [data-chart="e2e"] rect[data-bar]`)
      .evaluateAll((els) => els.map((e) => e.getBoundingClientRect().height))
    const top = Math.max(...heights)
    const largest = Math.max(m.e2e_p50!, m.e2e_p90!, m.e2e_p99!)
    expect(heights[0]! / top).toBeCloseTo(m.e2e_p50! / largest, 1)
    expect(heights[2]! / top).toBeCloseTo(m.e2e_p99! / largest, 1)
    const axisBottoms = await page
      .locator(`${one} [data-chart="e2e"] rect[data-bar]`)
      .evaluateAll((els) => els.map((e) => Math.round(e.getBoundingClientRect().bottom)))
    expect(new Set(axisBottoms).size).toBe(1)
    await screenshot(page, 'benchmark-run')
  })

  it('compares two runs side by side', async () => {
    const created = await api<{ benchmark: BenchmarkRun }>('/api/benchmarks', {
      method: 'POST',
      body: JSON.stringify({
        name: 'second run',
        mode: 'isolated',
        scenarios: [
          {
            instanceId,
            inputTokens: 32,
            outputTokens: 24,
            concurrency: 4,
            warmupRequests: 0,
            totalRequests: 24,
          },
        ],
      }),
    })
    const second = await waitFor(
      'the second run to finish',
      async () => {
        const r = (await api<{ benchmark: BenchmarkRun }>(`/api/benchmarks/${created.benchmark.id}`))
          .benchmark
        return r.status === 'completed' ? r : undefined
      },
      { timeoutMs: 30_000, wake: (n) => gw.host.bus.on('benchmarks.event', n) },
    )
    await page.evaluate(() => {
      location.hash = '/benchmarks'
    })
    const rows = page.locator('table.runs tr[data-run]')
    await rows.nth(1).waitFor()
    await screenshot(page, 'benchmarks')
    await page.locator('table.runs input[type=checkbox]').nth(0).check()
    await page.locator('table.runs input[type=checkbox]').nth(1).check()
    await page.click('a.button:has-text("Compare")')
    await page.locator('.compare [data-chart="e2e"] rect[data-bar]').nth(5).waitFor()
    const values = await chartValues(page, 'e2e')
    const m2 = second.scenarios[0]!.metrics!
    for (const v of [m2.e2e_p50, m2.e2e_p90, m2.e2e_p99]) expect(values).toContain(v)
    // Scenario 1 of both runs side by side: one column each, named after its run.
    const heads = await page
      .locator('.compare section')
      .first()
      .locator('table.metrics thead th')
      .allTextContents()
    expect(heads.slice(1).sort()).toEqual(['first run', 'second run'])
    await screenshot(page, 'benchmark-compare')
  })

  it('saves a preset, loads it with its progress until the model is active again, deletes it; lists and deletes profiles', async () => {
    await page.evaluate(() => {
      location.hash = '/presets'
    })
    await page.fill('input[name=preset-name]', 'one opt')
    await page.click('button:has-text("Save preset")')
    const row = page.locator('table.presets tr[data-preset="one opt"]')
    await row.waitFor()
    expect(await row.locator('td').nth(1).textContent()).toBe('1')
    // The profile recorded when the model became ready, with the API's figures.
    const { profiles } = await api<{ profiles: { id: string; total_gpu_memory_gib: number }[] }>(
      '/api/memory/profiles',
    )
    expect(profiles.length).toBeGreaterThan(0)
    const p = profiles[0]!
    const total = page.locator(`tr[data-profile="${p.id}"] td[data-figure="total"]`)
    await total.waitFor()
    expect(await total.textContent()).toBe(`${p.total_gpu_memory_gib.toFixed(2)} GiB`)
    await screenshot(page, 'presets')

    await row.locator('button:has-text("Load preset")').click()
    await page.locator('.preset-progress').waitFor()
    await page.locator('.preset-progress[data-phase="completed"]').waitFor({ timeout: 30_000 })
    const models = await api<{ models: { status: string; id: string }[] }>('/api/v1/models')
    expect(models.models.map((x) => x.status)).toEqual(['active'])
    instanceId = models.models[0]!.id

    await row.locator('button:has-text("Delete preset")').click()
    await row.waitFor({ state: 'detached' })
    await page.locator(`tr[data-profile="${p.id}"] button:has-text("Delete profile")`).click()
    await page.locator(`tr[data-profile="${p.id}"]`).waitFor({ state: 'detached' })
    const after = await api<{ profiles: { id: string }[] }>('/api/memory/profiles')
    expect(after.profiles.some((x) => x.id === p.id)).toBe(false)
  }, 60_000)

  it('shows a read-only user these pages without a write control, and no 403', async () => {
    const viewer = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
    const ro = await browser.newPage()
    const seen: Response[] = []
    ro.on('response', (r) => seen.push(r))
    const runs = await api<{ benchmarks: { id: string }[] }>('/api/benchmarks')
    for (const path of ['/benchmarks', `/benchmarks/${runs.benchmarks[0]!.id}`, '/presets']) {
      await visit(ro, gw.url, viewer, path)
      await ro.locator('.page').first().waitFor()
      const buttons = await ro.locator('button').allTextContents()
      expect(buttons.filter((b) => WRITE_BUTTONS.test(b.trim()))).toEqual([])
    }
    expect(seen.filter((r) => r.status() === 403).map((r) => r.url())).toEqual([])
    await ro.close()
  })

  it('hides the cluster and router pages (their plugins are off) and says so at their address', async () => {
    expect(await page.locator('nav a:has-text("Cluster")').count()).toBe(0)
    expect(await page.locator('nav a:has-text("Router")').count()).toBe(0)
    expect(await page.locator('nav a:has-text("Benchmarks")').count()).toBe(1)
    await page.evaluate(() => {
      location.hash = '/cluster'
    })
    await page.locator('.note:has-text("not enabled")').waitFor()
  })

  it('made no request to any host but the gateway, and none failed', () => {
    const origin = new URL(gw.url).origin
    expect(browser.requests.filter((r) => new URL(r.url()).origin !== origin).map((r) => r.url())).toEqual([])
    expect(responses.filter((r) => r.status() >= 400).map((r) => `${r.status()} ${r.url()}`)).toEqual([])
  })
})

describe.skipIf(skip !== null)('the cluster page in a browser', () => {
  const pods: TestGateway[] = []
  let browser: TestBrowser

  beforeAll(async () => {
    pods.push(
      ...(await startStaticPods({
        ids: ['east', 'west'],
        enginePortBase: 21230,
        hostEnv: AUTH,
        secret: 'dashboard-cluster-secret-0123456',
      })),
    )
    const token = (await pods[1]!.host.auth.issueToken('ops', ['admin'])).token
    const r = await pods[1]!.json<{ instance_id: string }>('/api/v1/models/load', {
      method: 'POST',
      headers: { authorization: `Bearer ${token}` },
      body: JSON.stringify({
        model_path: 'facebook/opt-125m',
        served_model_name: 'west-model',
        gpu_ids: [1],
      }),
    })
    expect(r.status).toBe(202)
    await waitFor(
      "pod east's routing table to list west-model",
      async () => {
        const t = await pods[0]!.json<{ entries: Record<string, unknown[]> }>('/api/cluster/routing-table', {
          headers: { authorization: `Bearer ${token}` },
        })
        return (t.body.entries['west-model']?.length ?? 0) > 0
      },
      { timeoutMs: 30_000, pollMs: 100 },
    )
    browser = await openBrowser()
  }, 60_000)
  afterAll(async () => {
    await browser?.close()
    for (const p of pods) await p.stop()
  })

  it('shows both pods, the leader and term, the routing table and every pod’s GPUs', async () => {
    const page = await browser.newPage()
    const token = (await pods[0]!.host.auth.issueToken('ops', ['admin'])).token
    await visit(page, pods[0]!.url, token, '/cluster')
    await page.locator('table.pods tr[data-pod="west"]').waitFor()
    expect(await page.locator('table.pods tr[data-pod]').count()).toBe(2)
    expect(await page.locator('table.pods tr[data-pod="east"]').getAttribute('data-role')).toBe('leader')
    expect(await page.locator('[data-leader]').getAttribute('data-leader')).toBe('east')
    expect(await page.locator('[data-leader] .stat-label').textContent()).toContain('term 1')
    expect(await page.locator('[data-health]').getAttribute('data-health')).toBe('healthy')
    expect(await page.locator('table.routing tr[data-route="west-model"] td').nth(1).textContent()).toContain(
      'west:',
    )
    await page.locator('[data-pod-gpus="west"] .gpu').nth(1).waitFor()
    expect(await page.locator('[data-pod-gpus="east"] .gpu').count()).toBe(2)
    // The model's footprint is drawn on west's GPU 1, in its own segment.
    await page.locator('[data-pod-gpus="west"] .gpu[data-gpu="1"] .seg.instance').waitFor()
    expect(await page.locator('nav a:has-text("Cluster")').count()).toBe(1)
    await screenshot(page, 'cluster')
    await page.close()
  })
})

describe.skipIf(skip !== null)('the router page in a browser', () => {
  let gw: TestGateway
  let browser: TestBrowser
  let routerPort = 0
  let admin = ''
  const MODEL = 'routed-model'

  beforeAll(async () => {
    routerPort = await freePort()
    gw = await startGateway({
      ports: [21250, 21259],
      env: { SIM_TOKENS_PER_SEC: '400' },
      hostEnv: { ...AUTH, INFERENCE_API_KEY: KEY },
      extraYaml: `  router: { host: 127.0.0.1, port: ${routerPort}, from_gateway: true, auto_sleep: { min_sleep_duration: 0 } }\n`,
    })
    admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
    const id = await gw.load(
      {
        model_path: 'facebook/opt-125m',
        served_model_name: MODEL,
        enable_sleep_mode: true,
      },
      admin,
    )
    await gw.waitStatus(id, 'active', 30_000, admin)
    // Three chats through the router's own /v1.
    for (let i = 0; i < 3; i++) {
      const c = await fetch(`http://127.0.0.1:${routerPort}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
      })
      expect(c.status).toBe(200)
      await c.text()
    }
    browser = await openBrowser()
  }, 60_000)
  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
  })

  it('shows the traffic and state of the router’s model, sleeps and wakes it, all through the gateway’s origin', async () => {
    const page = await browser.newPage()
    const statuses: number[] = []
    page.on('response', (r) => statuses.push(r.status()))
    await visit(page, gw.url, admin, '/router')
    const row = page.locator(`table.router-models tr[data-model="${MODEL}"]`)
    await row.waitFor()
    expect(await row.getAttribute('data-state')).toBe('active')
    expect(await row.locator('td[data-figure="requests"]').textContent()).toBe('3/3')
    await screenshot(page, 'router')
    await row.locator('button:has-text("Sleep")').click()
    await page.locator(`tr[data-model="${MODEL}"][data-state="sleeping"]`).waitFor({ timeout: 20_000 })
    await screenshot(page, 'router-sleeping')
    await page.locator(`tr[data-model="${MODEL}"] button:has-text("Wake")`).click()
    await page.locator(`tr[data-model="${MODEL}"][data-state="active"]`).waitFor({ timeout: 20_000 })
    // A read-only user sees the page without its buttons, and meets no 403.
    const viewer = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
    const ro = await browser.newPage()
    const roStatuses: number[] = []
    ro.on('response', (r) => roStatuses.push(r.status()))
    await visit(ro, gw.url, viewer, '/router')
    await ro.locator(`tr[data-model="${MODEL}"]`).waitFor()
    expect(await ro.locator('table.router-models button').count()).toBe(0)
    expect(roStatuses.filter((s) => s === 403)).toEqual([])
    const origin = new URL(gw.url).origin
    expect(browser.requests.filter((r) => new URL(r.url()).origin !== origin).map((r) => r.url())).toEqual([])
    expect(statuses.filter((s) => s >= 400)).toEqual([])
    await ro.close()
    await page.close()
  })

  it('refuses the router actions to the read-only role and without a token', async () => {
    const viewer = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
    const ro = await gw.json(`/api/dashboard/router/models/${MODEL}/sleep`, {
      method: 'POST',
      headers: { authorization: `Bearer ${viewer}` },
    })
    expect(ro.status).toBe(403)
    const anon = await fetch(`${gw.url}/api/dashboard/router`)
    expect(anon.status).toBe(401)
    const unknown = await gw.json<{ error: { code: string } }>('/api/dashboard/router/models/no-such/sleep', {
      method: 'POST',
      headers: { authorization: `Bearer ${admin}` },
    })
    expect(unknown.status).toBe(404)
  })
})
