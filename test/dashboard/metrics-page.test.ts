import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Page } from 'playwright-core'
import type { TimeSeries } from '../../plugins/gateway/timeseries/ring.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'
import { browserMissing, openBrowser, screenshot, signedIn, type TestBrowser } from './browser.ts'

/**
 * The Metrics page in a real headless chromium against a real gateway under a little traffic: what
 * uPlot draws (each chart's `uplot.data`) is what `/api/dashboard/timeseries` answers, sample for
 * sample; new samples arrive over the page's one event stream; the page's CSP is never violated.
 */
const KEY = 'sk-metrics-page-key'
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-metrics-page', JWT_SECRET: 'm'.repeat(40) }
const MODEL = 'Qwen/Qwen2.5-0.5B'

const skip = browserMissing()

type Drawn = { lines: string; data: (number | null)[][] }

/** drawn: each chart's lines and uPlot's data (seconds, then one column per line). */
function drawn(page: Page, id: string): Promise<Drawn> {
  return page.locator(`#${id}`).evaluate((el) => {
    const u = (el as unknown as { uplot?: { data: (number | null)[][] } }).uplot
    return { lines: el.getAttribute('data-lines') ?? '', data: u ? u.data.map((c) => [...c]) : [] }
  })
}

describe.skipIf(skip !== null)('the metrics page in a browser', () => {
  let gw: TestGateway
  let browser: TestBrowser
  let page: Page
  let admin = ''
  const violations: string[] = []
  const series = async () =>
    (
      await gw.json<TimeSeries>('/api/dashboard/timeseries', {
        headers: { authorization: `Bearer ${admin}` },
      })
    ).body

  beforeAll(async () => {
    gw = await startGateway({
      ports: [23520, 23529],
      env: { SIM_TOKENS_PER_SEC: '400', SIM_TTFT_MS: '15' },
      hostEnv: { ...AUTH, INFERENCE_API_KEY: KEY },
    })
    admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
    const r = await gw.json<{ instance_id: string }>('/api/v1/models/load', {
      method: 'POST',
      headers: { authorization: `Bearer ${admin}` },
      body: JSON.stringify({ model_path: MODEL, gpu_ids: [0], gpu_memory_utilization: 0.3 }),
    })
    await waitFor(
      'the model active',
      async () =>
        (
          await gw.json<{ model: { status: string } }>(`/api/v1/models/${r.body.instance_id}`, {
            headers: { authorization: `Bearer ${admin}` },
          })
        ).body.model.status === 'active',
      { timeoutMs: 30_000, wake: (n) => gw.host.bus.on('gateway.instance.status', n) },
    )
    // A little traffic until a sample has counted some of it (one sample every 5 s).
    await waitFor(
      'a sample with requests and tokens',
      async () => {
        const chat = await fetch(`${gw.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
          body: JSON.stringify({
            model: MODEL,
            messages: [{ role: 'user', content: 'hi' }],
            max_tokens: 16,
            stream: true,
          }),
        })
        await chat.text()
        const ts = await series()
        return (
          (ts.series.requests_per_second ?? []).some((v) => (v ?? 0) > 0) &&
          (ts.series.tokens_per_second ?? []).some((v) => (v ?? 0) > 0)
        )
      },
      { timeoutMs: 30_000, pollMs: 200 },
    )
    browser = await openBrowser()
    page = await browser.newPage()
    page.on('console', (m) => {
      if (/Content.Security.Policy|Refused to/i.test(m.text())) violations.push(m.text())
    })
    await signedIn(page, gw.url, admin, '/metrics')
  }, 90_000)
  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
  })

  it('draws every series the API has, value for value, and keeps drawing as samples arrive', async () => {
    await page.locator('#chart-gpu').waitFor()
    await waitFor('the charts drawn', async () => (await drawn(page, 'chart-requests')).data[0]?.length, {
      timeoutMs: 10_000,
    })
    const charts = {
      'chart-requests': ['requests_per_second', 'errors_per_second'],
      'chart-ttft': ['ttft_p50_ms', 'ttft_p99_ms'],
      'chart-tokens': ['tokens_per_second'],
      'chart-queued': ['queued_p99_ms'],
      'chart-kv': [`kv_cache_usage/${MODEL}`],
      'chart-gpu': [`gpu_memory_gib/${MODEL}`],
    }
    const shown: Record<string, Drawn> = {}
    for (const id of Object.keys(charts)) shown[id] = await drawn(page, id)
    const api = await series()
    for (const [id, names] of Object.entries(charts)) {
      const d = shown[id]!
      expect(d.lines).toBe(names.join('|'))
      const [times, ...columns] = d.data
      expect(times!.length).toBeGreaterThan(0)
      // Every drawn sample is in the API's ring, with the same value in every series.
      for (const [i, sec] of times!.entries()) {
        const at = api.t.indexOf(sec! * 1000)
        expect(at).toBeGreaterThanOrEqual(0)
        for (const [k, name] of names.entries())
          expect(columns[k]![i]).toEqual(api.series[name]?.[at] ?? null)
      }
    }
    // The traffic is drawn: some requests, some tokens, the model's GPU memory.
    expect(shown['chart-requests']!.data[1]!.some((v) => (v ?? 0) > 0)).toBe(true)
    expect(shown['chart-tokens']!.data[1]!.some((v) => (v ?? 0) > 0)).toBe(true)
    expect(shown['chart-ttft']!.data[2]!.some((v) => (v ?? 0) > 0)).toBe(true)
    expect(shown['chart-gpu']!.data[1]!.some((v) => (v ?? 0) > 1)).toBe(true)
    // A new sample comes over the event stream and is drawn (no reload, no polling).
    const before = shown['chart-requests']!.data[0]!.length
    await waitFor(
      'a new sample drawn',
      async () => ((await drawn(page, 'chart-requests')).data[0]?.length ?? 0) > before,
      { timeoutMs: 15_000, pollMs: 100 },
    )
    expect(violations).toEqual([])
    await screenshot(page, 'metrics')
  }, 60_000)
})
