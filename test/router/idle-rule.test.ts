import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { waitFor } from '../support/wait.ts'
import { startRouterWithGateway, type TestRouter } from './support.ts'

/**
 * The router's auto-sleep of gateway models is a rule of the host's residency manager (one owner of
 * what is resident): a pinned catalogue model is never an auto-sleep candidate, and each idle sleep
 * is one of the manager's decisions (GET /api/residency, trigger `idle`) and counted in
 * modelgate_residency_actions_total{reason="idle"}. An operator's sleep through the router is not
 * the rule's: it sleeps a pinned model too and records no decision.
 */
let r: TestRouter & { simDir: string }

type Residency = {
  models: { name: string; state: string }[]
  decisions: {
    trigger: { kind: string; model: string; need_gib: number }
    victims: { model: string; action: string; freed_gib: number; expected_cost_s: number }[]
    reason: string
  }[]
}

const residency = async () => (await r.main<Residency>('/api/residency')).body
const stateOf = async (name: string) => (await residency()).models.find((m) => m.name === name)?.state
const routerState = async (name: string) =>
  (await r.get<{ models: Record<string, { status: string }> }>('/sleep/status')).body.models[name]?.status
const candidates = async () =>
  (await r.get<{ candidates: { model: string }[] }>('/sleep/candidates')).body.candidates
    .map((c) => c.model)
    .sort()

beforeAll(async () => {
  r = await startRouterWithGateway(
    [18420, 18429],
    `
from_gateway: true
auto_sleep: { enabled: true, idle_threshold: 60, check_interval: 1, level: 1, min_sleep_duration: 0 }
`,
    {},
    `    residency: { policy: cost, min_resident_seconds: 0 }
    catalog:
      - { name: keep, model_path: org/keep-7b, gpu_memory_utilization: 0.3, enable_sleep_mode: true, pin: true, preload: true }
      - { name: idle, model_path: org/idle-7b, gpu_memory_utilization: 0.3, enable_sleep_mode: true, preload: true }
`,
  )
  await waitFor(
    'both catalogued models resident',
    async () => (await stateOf('keep')) === 'active' && (await stateOf('idle')) === 'active',
    { timeoutMs: 30_000 },
  )
  await waitFor('the router follows both', async () => (await routerState('idle')) === 'active', {
    timeoutMs: 10_000,
  })
})

afterAll(async () => {
  await r?.stop()
})

describe('auto-sleep as the residency manager’s idle rule', () => {
  it('sleeps the idle model as a recorded decision and never offers the pinned one', async () => {
    expect(await candidates()).toEqual([])
    r.clock.advance(120_000)
    // Both are idle past the threshold now; only the unpinned one is a candidate.
    const offered = await candidates()
    expect(offered.includes('keep')).toBe(false)
    // The decision is recorded once the sleep (drain, sleep, check) has ended.
    await waitFor(
      'the idle rule’s decision',
      async () => (await residency()).decisions.some((x) => x.trigger.kind === 'idle'),
      { timeoutMs: 20_000 },
    )
    expect(await routerState('idle')).toBe('sleeping')
    expect(await stateOf('idle')).toBe('sleeping')
    const d = (await residency()).decisions.find((x) => x.trigger.kind === 'idle')
    expect(d!.trigger).toMatchObject({ kind: 'idle', model: 'idle', need_gib: 0 })
    expect(d!.victims).toHaveLength(1)
    expect(d!.victims[0]).toMatchObject({ model: 'idle', action: 'sleep1' })
    expect(d!.victims[0]!.freed_gib).toBeGreaterThan(0)
    expect(d!.victims[0]!.expected_cost_s).toBeGreaterThan(0)
    expect(d!.reason).toMatch(/^idle (for \d+ s|since it was loaded)$/)
    const metrics = await (await fetch(`${r.url}/metrics`)).text()
    expect(metrics).toContain(
      'modelgate_residency_actions_total{model="idle",action="sleep1",reason="idle"} 1',
    )
    // The pinned model stays: still active, still not a candidate, and no decision names it.
    expect(await stateOf('keep')).toBe('active')
    expect(await candidates()).toEqual([])
    expect((await residency()).decisions.some((x) => x.trigger.model === 'keep')).toBe(false)
  })

  it('lets an operator sleep the pinned model through the router, outside the rule', async () => {
    const res = await r.post<{ status: string }>('/action/sleep/keep')
    expect(res.status).toBe(200)
    expect(res.body.status).toBe('success')
    expect(await stateOf('keep')).toBe('sleeping')
    expect((await residency()).decisions.some((x) => x.trigger.model === 'keep')).toBe(false)
    const metrics = await (await fetch(`${r.url}/metrics`)).text()
    expect(metrics).not.toContain('model="keep",action="sleep1",reason="idle"')
  })
})
