import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { browserMissing, openBrowser, type TestBrowser, visit } from '../dashboard/browser.ts'
import { AUTH_ENV } from '../keys/support.ts'
import { cleanupSims } from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'
import { chat, startRouterWithGateway, type TestRouter } from './support.ts'

/**
 * A catalogued model with no instance is not asleep: through a real gateway and router, the router
 * lists it as `unloaded` (not `sleeping`) in GET /sleep/status and the dashboard's overview, counts
 * it in neither figure of /health, refuses to sleep or wake it (a request loads it), and its
 * dashboard row offers no Wake. Once a request has loaded it, it is active like any other.
 */
let r: TestRouter & { simDir: string }
let admin = ''

type SleepStatus = {
  models: Record<string, { status: string; sleep_time?: unknown; last_activity?: unknown }>
}
const status = async () => (await r.get<SleepStatus>('/sleep/status')).body.models

beforeAll(async () => {
  r = await startRouterWithGateway(
    [26200, 26209],
    'from_gateway: true\nauto_sleep: { min_sleep_duration: 0 }\n',
    AUTH_ENV,
    `    catalog:
      - { name: resident, model_path: org/resident-7b, gpu_memory_utilization: 0.3, enable_sleep_mode: true, preload: true }
      - { name: later, model_path: org/later-7b, gpu_memory_utilization: 0.3, enable_sleep_mode: true }
`,
  )
  admin = (await r.host.auth.issueToken('ops', ['admin'])).token
  await waitFor(
    'the router follows the resident model',
    async () => (await status()).resident?.status === 'active',
    {
      timeoutMs: 30_000,
    },
  )
}, 60_000)

afterAll(async () => {
  await r?.stop()
  cleanupSims()
})

describe('a catalogued model with no instance', () => {
  it('is unloaded, not sleeping, in /sleep/status and counts in neither /health figure', async () => {
    const models = await status()
    expect(models.resident!.status).toBe('active')
    expect(models.later).toEqual({ status: 'unloaded', last_activity: null })
    const health = (await r.get<{ models_active: number; models_sleeping: number }>('/health')).body
    expect(health.models_active).toBe(1)
    expect(health.models_sleeping).toBe(0)
    // It is still a model the router routes.
    expect((await r.get<{ data: { id: string }[] }>('/models')).body.data.map((m) => m.id).sort()).toEqual([
      'later',
      'resident',
    ])
  })

  it('is refused a sleep and a wakeup (409: a request loads it), and nothing loads', async () => {
    const wake = await r.post<{ status: string; message: string }>('/action/wakeup/later')
    expect(wake.status).toBe(409)
    expect(wake.body).toMatchObject({ status: 'error', model: 'later' })
    expect(wake.body.message).toContain('not loaded')
    const sleep = await r.post<{ status: string; message: string }>('/action/sleep/later')
    expect(sleep.status).toBe(409)
    expect(sleep.body.message).toContain('not loaded')
    expect((await status()).later!.status).toBe('unloaded')
  })

  it('is unloaded in the dashboard overview, with no Wake on its row', async () => {
    const res = await fetch(`${r.url}/api/dashboard/router`, {
      headers: { authorization: `Bearer ${admin}` },
    })
    expect(res.status).toBe(200)
    const body = (await res.json()) as { sleep: Record<string, { status: string }> }
    expect(body.sleep.later!.status).toBe('unloaded')
    expect(body.sleep.resident!.status).toBe('active')
  })

  it.skipIf(browserMissing() !== null)(
    'shows no Wake (nor Sleep) and no engine address on the page',
    async () => {
      let browser: TestBrowser | undefined
      try {
        browser = await openBrowser()
        const page = await browser.newPage()
        await visit(page, r.url, admin, '/router')
        const row = page.locator('table.router-models tr[data-model="later"]')
        await row.waitFor()
        expect(await row.getAttribute('data-state')).toBe('unloaded')
        expect(await row.locator('button').count()).toBe(0)
        expect(await row.locator('td').first().textContent()).not.toContain(':0')
        // The loaded model keeps its Sleep.
        const resident = page.locator('table.router-models tr[data-model="resident"]')
        expect(await resident.locator('button:has-text("Sleep")').count()).toBe(1)
      } finally {
        await browser?.close()
      }
    },
  )

  it('becomes active once a request has loaded it', async () => {
    const res = await r.post('/v1/chat/completions', chat('later'))
    expect(res.status).toBe(200)
    await waitFor('later active', async () => (await status()).later?.status === 'active', {
      timeoutMs: 20_000,
    })
  })
})
