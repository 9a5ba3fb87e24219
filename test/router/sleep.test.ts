import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { RouterService } from '../../plugins/router/service.ts'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'
import { chat, engineHits, modelsYaml, startRouter, startSim, type TestRouter } from './support.ts'

/**
 * Auto-sleep of idle models (and never of a busy one), wake on request in hold mode with its
 * deadline, and a restarted router that remembers who sleeps by asking the engines.
 */
const IDLE = 'idle-model'
const BUSY = 'busy-model'
const SLOW = 'slow-waker'

let idle: EngineProc
let busy: EngineProc
let slow: EngineProc
let r: TestRouter | null = null

type Status = { models: Record<string, { status: string; sleep_time?: string }> }
/**
 * autoSleepCheck runs the check that auto-sleep's timer runs every check_interval, at once (the
 * timer runs too; a second check finds the sleep under way and leaves it).
 */
const autoSleepCheck = (router: TestRouter) => router.host.api<RouterService>('router').sleep.tick()
const stateOf = async (router: TestRouter, model: string) =>
  (await router.get<Status>('/sleep/status')).body.models[model]?.status

beforeAll(async () => {
  ;[idle, busy, slow] = await Promise.all([
    startSim(IDLE, { wakeDelayMs: 900 }),
    startSim(BUSY, { tokensPerSec: 20, wakeDelayMs: 900 }),
    startSim(SLOW, { wakeDelayMs: 9000 }),
  ])
})

afterAll(async () => {
  await r?.stop()
  await cleanupSims()
})

describe('router auto-sleep', () => {
  it('sleeps a model idle past its threshold and not one with a stream in flight', async () => {
    r = await startRouter(`
${modelsYaml([
  { name: IDLE, port: idle.port },
  { name: BUSY, port: busy.port },
])}
auto_sleep: { enabled: true, idle_threshold: 1, check_interval: 1 }
`)
    // 60 tokens at 20 tokens/s: a 3 s stream, in flight through the checks below.
    const res = await fetch(`${r.routerUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(chat(BUSY, { stream: true, max_tokens: 60, ignore_eos: true })),
    })
    expect(res.status).toBe(200)
    const body = res.text()

    // Both models have been idle past the threshold by the router's clock; the stream keeps BUSY busy.
    r.clock.advance(1000)
    autoSleepCheck(r)
    await waitFor('the idle model asleep', async () => (await stateOf(r!, IDLE)) === 'sleeping', {
      timeoutMs: 4000,
    })
    expect(await (await fetch(`http://127.0.0.1:${idle.port}/is_sleeping`)).json()).toEqual({
      is_sleeping: true,
    })
    expect(await stateOf(r, BUSY)).toBe('active')
    const candidates = await r.get<{ candidates: { model: string }[]; auto_sleep_enabled: boolean }>(
      '/sleep/candidates',
    )
    expect(candidates.body.auto_sleep_enabled).toBe(true)
    expect(candidates.body.candidates.map((c) => c.model)).not.toContain(BUSY)
    // A manual sleep of the busy model drains it first (real vLLM's /sleep would abort the stream):
    // the stream ends whole, then the engine sleeps and the action answers.
    const sleeping = r.post(`/action/sleep/${BUSY}`)
    const text = await body
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true)
    expect(text).not.toContain('"finish_reason":"abort"')
    const slept = await sleeping
    expect(slept.status).toBe(200)
    expect(slept.body).toMatchObject({ status: 'success', model: BUSY, message: 'Model put to sleep' })
    expect(await stateOf(r, BUSY)).toBe('sleeping')
    expect(engineHits(busy, 'POST', '/sleep')).toBe(1)
    const stats = await r.get<{
      by_model: Record<string, { total_requests: number; successful_requests: number }>
    }>('/traffic/stats')
    expect(stats.body.by_model[BUSY]).toMatchObject({ total_requests: 1, successful_requests: 1 })
  })
})

describe('router restart', () => {
  it('keeps the sleep state by reading each engine at start-up', async () => {
    await r!.stop()
    r = null
    r = await startRouter(`
${modelsYaml([
  { name: IDLE, port: idle.port },
  { name: BUSY, port: busy.port },
  { name: SLOW, port: slow.port },
])}
wake_on_request: hold
hold_timeout: 2
`)
    const status = await r.get<Status>('/sleep/status')
    expect(status.body.models[IDLE]).toMatchObject({ status: 'sleeping' })
    expect(status.body.models[BUSY]).toMatchObject({ status: 'sleeping' })
    expect(status.body.models[SLOW]).toMatchObject({ status: 'active' })
    expect((await r.get('/health')).body).toMatchObject({ models_active: 1, models_sleeping: 2 })
  })
})

describe('router wake on request (hold)', () => {
  it('holds concurrent requests through one wake and serves them all', async () => {
    const wakes = engineHits(idle, 'POST', '/wake_up')
    const results = await Promise.all(
      Array.from({ length: 5 }, () => r!.post<{ object: string }>('/v1/chat/completions', chat(IDLE))),
    )
    expect(results.map((x) => x.status)).toEqual([200, 200, 200, 200, 200])
    expect(results[0]!.body.object).toBe('chat.completion')
    expect(engineHits(idle, 'POST', '/wake_up') - wakes).toBe(1)
    expect(await stateOf(r!, IDLE)).toBe('active')
  })

  it('answers 503 model_waking when the wake outlasts hold_timeout', async () => {
    expect((await r!.post(`/action/sleep/${SLOW}`)).status).toBe(200)
    // A client that gives up while held stops waiting (counted as a failed request).
    const gaveUp = await fetch(`${r!.routerUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(chat(SLOW)),
      signal: AbortSignal.timeout(300),
    }).catch((e: Error) => e.name)
    expect(gaveUp).toBe('TimeoutError')
    const t0 = performance.now()
    const res = await r!.post('/v1/chat/completions', chat(SLOW))
    const waited = performance.now() - t0
    expect(res.status).toBe(503)
    expect((res.body as { error: { code: string; type: string } }).error).toMatchObject({
      type: 'service_unavailable',
      code: 'model_waking',
    })
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    expect(waited).toBeGreaterThanOrEqual(1900)
    expect(await stateOf(r!, SLOW)).toBe('waking')
    const stats = await r!.get<{ total_requests: number; failed_requests: number }>(`/traffic/stats/${SLOW}`)
    expect(stats.body).toMatchObject({ total_requests: 2, failed_requests: 2 })
  })
})

describe('router wake failures', () => {
  it('answers 502 wake_failed while a failed wake cools down, instead of starting another', async () => {
    const doomed = await startSim('doomed-model')
    const rr = await startRouter(`${modelsYaml([{ name: 'doomed-model', port: doomed.port }])}\n`)
    try {
      const slept = await fetch(`${rr.routerUrl}/action/sleep/doomed-model`, { method: 'POST' })
      expect(slept.status).toBe(200)
      process.kill(-doomed.pid, 'SIGKILL') // the engine dies while asleep: its wake can only fail
      await doomed.exited
      const post = () =>
        fetch(`${rr.routerUrl}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(chat('doomed-model')),
        })
      const first = await post()
      expect(first.status).toBe(503)
      expect(((await first.json()) as { error: { code: string } }).error.code).toBe('model_waking')
      await waitFor('the wake to fail', async () => (await stateOf(rr, 'doomed-model')) === 'sleeping', {
        timeoutMs: 5000,
      })
      const second = await post()
      expect(second.status).toBe(502)
      const err = ((await second.json()) as { error: { code: string; message: string } }).error
      expect(err.code).toBe('wake_failed')
      expect(err.message).toContain('the last wake failed')
    } finally {
      await rr.stop()
    }
  })
})
