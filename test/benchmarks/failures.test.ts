import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { BenchmarkRun } from '../../plugins/benchmarks/schemas.ts'
import { browserMissing, openBrowser } from '../dashboard/browser.ts'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import type { TestHost } from '../support/host.ts'
import { bootHost, createRun, type FakeGateway, fakeGateway, instance, startSim, waitRun } from './support.ts'

/**
 * A proxy-mode run whose every request the proxy refuses 401 (the benchmarks send a key the proxy
 * does not take): the run says it failed and why, in its API answer and on its page, and shows no
 * latency it never measured.
 */
let engine: EngineProc
let gw: FakeGateway
let th: TestHost
let run: BenchmarkRun

beforeAll(async () => {
  engine = await startSim({ SIM_TOKENS_PER_SEC: '400', SIM_TTFT_MS: '20' })
  gw = fakeGateway([instance('steady', engine.port)], { requireKey: 'sk-current' })
  th = await bootHost(gw, { env: { INFERENCE_API_KEY: 'sk-stale' } })
  const created = await createRun(th.url, 'isolated', [
    {
      instanceId: 'steady',
      routingMode: 'proxy',
      inputTokens: 16,
      outputTokens: 8,
      concurrency: 4,
      warmupRequests: 0,
      totalRequests: 20,
    },
  ])
  run = await waitRun(th, created.id)
})

afterAll(async () => {
  await th?.stop()
  await cleanupSims()
})

describe('a benchmark none of whose requests succeeded', () => {
  it('fails, with the counts by status and the first error messages in its API answer', () => {
    expect(gw.proxied.get('Bearer sk-stale')).toBe(20)
    expect(run.status).toBe('failed')
    const s = run.scenarios[0]!
    expect(s.status).toBe('failed')
    expect(s.error).toBe(
      'all 20 measured requests failed (401 × 20): HTTP 401: invalid_api_key: Invalid API key',
    )
    expect(run.error).toContain('HTTP 401: invalid_api_key: Invalid API key')
    const m = s.metrics!
    expect(m.successful_requests).toBe(0)
    expect(m.failed_requests).toBe(20)
    expect(m.failed_by_status).toEqual({ '401': 20 })
    expect(m.first_errors).toEqual(['HTTP 401: invalid_api_key: Invalid API key'])
    // nothing succeeded, so nothing was timed: no TTFT of 0 ms
    expect(m.ttft_p50).toBeNull()
    expect(m.ttft_avg).toBeNull()
    expect(m.e2e_p99).toBeNull()
    expect(m.tpot_p50).toBeNull()
  })

  it.skipIf(browserMissing() !== null)('shows the cause on the run page and — for its TTFT', async () => {
    const browser = await openBrowser()
    try {
      const page = await browser.newPage()
      await page.goto(`${th.url}/#/benchmarks/${run.id}`)
      const scenario = page.locator(`[data-scenario="${run.scenarios[0]!.id}"]`)
      await scenario.locator('[data-failures]').waitFor()
      expect(await scenario.getAttribute('data-scenario-status')).toBe('failed')
      expect(await scenario.locator('[data-failed-status="401"]').textContent()).toBe('401 × 20')
      expect(await scenario.locator('[data-first-error]').allTextContents()).toEqual([
        'HTTP 401: invalid_api_key: Invalid API key',
      ])
      expect(await scenario.locator('[data-figure="TTFT p50 / p99"]').textContent()).toBe('— / —')
      expect(await page.locator(`[data-run="${run.id}"]`).getAttribute('data-status')).toBe('failed')
    } finally {
      await browser.close()
    }
  })
})
