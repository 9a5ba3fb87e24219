import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Page } from 'playwright-core'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { startStaticPods } from '../support/pods.ts'
import { waitFor } from '../support/wait.ts'
import { browserMissing, openBrowser, type TestBrowser, visit } from './browser.ts'

/**
 * The router's and the cluster's pages are fed by the dashboard's one live stream: each reads its
 * view once, then draws what its plugin publishes on change (`router.changed`, `cluster.changed`).
 * A change made behind the page's back shows on it with no second read of the view (a page that
 * polled would need one to see it). Real chromium, real gateways (simulated GPUs and engines), auth on.
 */
const KEY = 'sk-dashboard-live-key'
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-dashboard-live', JWT_SECRET: 'l'.repeat(40) }

const skip = browserMissing()

/** readsOf counts the page's requests to each of `paths` (the path alone, no query). */
function readsOf(page: Page, paths: string[]): Map<string, number> {
  const counts = new Map(paths.map((p) => [p, 0]))
  page.on('request', (r) => {
    const p = new URL(r.url()).pathname
    if (counts.has(p)) counts.set(p, (counts.get(p) ?? 0) + 1)
  })
  return counts
}

describe.skipIf(skip !== null)('the router page follows the live stream', () => {
  let gw: TestGateway
  let browser: TestBrowser
  let routerPort = 0
  let admin = ''
  const MODEL = 'live-routed-model'

  beforeAll(async () => {
    routerPort = await freePort()
    gw = await startGateway({
      ports: [21360, 21369],
      hostEnv: { ...AUTH, INFERENCE_API_KEY: KEY },
      extraYaml: `  router: { host: 127.0.0.1, port: ${routerPort}, from_gateway: true }\n`,
    })
    admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
    const id = await gw.load({ model_path: 'facebook/opt-125m', served_model_name: MODEL }, admin)
    await gw.waitStatus(id, 'active', 30_000, admin)
    browser = await openBrowser()
  }, 60_000)
  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
  })

  it('draws a request through the router from the pushed overview, reading the router once', async () => {
    const page = await browser.newPage()
    const reads = readsOf(page, ['/api/dashboard/router'])
    await visit(page, gw.url, admin, '/router')
    const figure = page.locator(`tr[data-model="${MODEL}"] td[data-figure="requests"]`)
    await figure.waitFor()
    expect(await figure.textContent()).toBe('0/0')
    const chat = await fetch(`http://127.0.0.1:${routerPort}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    })
    expect(chat.status).toBe(200)
    await chat.text()
    await page.locator(`tr[data-model="${MODEL}"] td[data-figure="requests"]:text-is("1/1")`).waitFor()
    expect(reads.get('/api/dashboard/router')).toBe(1)
    await page.close()
  })
})

describe.skipIf(skip !== null)('the cluster page follows the live stream', () => {
  const pods: TestGateway[] = []
  let browser: TestBrowser
  let token = ''

  beforeAll(async () => {
    pods.push(
      ...(await startStaticPods({
        ids: ['north', 'south'],
        enginePortBase: 21370,
        hostEnv: AUTH,
        secret: 'dashboard-live-cluster-secret-01',
      })),
    )
    token = (await pods[0]!.host.auth.issueToken('ops', ['admin'])).token
    await waitFor(
      'north to hear south',
      async () =>
        (
          await pods[0]!.json<{ healthyPodCount: number }>('/api/cluster', {
            headers: { authorization: `Bearer ${token}` },
          })
        ).body.healthyPodCount === 2,
      { timeoutMs: 30_000, pollMs: 100 },
    )
    browser = await openBrowser()
  }, 60_000)
  afterAll(async () => {
    await browser?.close()
    for (const p of pods) await p.stop()
  })

  it('draws a model loaded on the other pod from the pushed view, reading the cluster once', async () => {
    const page = await browser.newPage()
    const views = ['/api/cluster', '/api/cluster/pods', '/api/cluster/routing-table']
    const reads = readsOf(page, views)
    await visit(page, pods[0]!.url, token, '/cluster')
    await page.locator('table.pods tr[data-pod="south"]').waitFor()
    expect(await page.locator('table.routing tr[data-route]').count()).toBe(0)
    const south = (await pods[1]!.host.auth.issueToken('ops', ['admin'])).token
    const r = await pods[1]!.json<{ instance_id: string }>('/api/v1/models/load', {
      method: 'POST',
      headers: { authorization: `Bearer ${south}` },
      body: JSON.stringify({
        model_path: 'facebook/opt-125m',
        served_model_name: 'south-model',
        gpu_ids: [1],
      }),
    })
    expect(r.status).toBe(202)
    // The leader's new table, and south's model on its GPU 1 (read again: what south holds changed).
    await page.locator('table.routing tr[data-route="south-model"]').waitFor({ timeout: 30_000 })
    await page
      .locator('[data-pod-gpus="south"] .gpu[data-gpu="1"] .seg.instance')
      .waitFor({ timeout: 30_000 })
    expect(Object.fromEntries(reads)).toEqual(Object.fromEntries(views.map((v) => [v, 1])))
    await page.close()
  })
})
