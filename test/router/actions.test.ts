import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'
import { chat, engineHits, startTwoAndGhost, type TestRouter, TWO_AND_GHOST } from './support.ts'

/**
 * The router's sleep and wake actions against simulator engines (and one endpoint where nothing
 * listens): success and refusal bodies, the minimum sleep duration, 502 for an engine that does
 * not answer, and requests for a sleeping model (one wake, 503 model_waking meanwhile).
 */
const { A, B, GHOST } = TWO_AND_GHOST
const enc = encodeURIComponent

let a: EngineProc
let r: TestRouter

const ISO = expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)

beforeAll(async () => {
  ;({ a, r } = await startTwoAndGhost({ wakeDelayMs: 1500 }))
})

afterAll(async () => {
  await r?.stop()
  await cleanupSims()
})

describe('router sleep and wake actions', () => {
  it('sleeps a model, refuses a second sleep and an early wakeup, then wakes it', async () => {
    const slept = await r.post(`/action/sleep/${enc(A)}`)
    expect(slept.status).toBe(200)
    expect(slept.body).toEqual({ status: 'success', model: A, message: 'Model put to sleep', timestamp: ISO })
    expect(await (await fetch(`http://127.0.0.1:${a.port}/is_sleeping`)).json()).toEqual({
      is_sleeping: true,
    })

    const status = await r.get<{ models: Record<string, unknown> }>('/sleep/status')
    expect(status.body.models).toEqual({
      [A]: { status: 'sleeping', sleep_time: ISO, sleep_duration: expect.any(Number), sleep_level: 1 },
      [B]: { status: 'active', last_activity: null },
      [GHOST]: { status: 'active', last_activity: null },
    })

    const again = await r.post(`/action/sleep/${enc(A)}`, {})
    expect(again.status).toBe(409)
    expect(again.body).toEqual({ status: 'error', model: A, message: 'Model is already sleeping' })

    const early = await r.post(`/action/wakeup/${enc(A)}`)
    expect(early.status).toBe(409)
    expect(early.body).toEqual({
      status: 'error',
      model: A,
      message: expect.stringContaining('minimum sleep duration is 2 s'),
      min_sleep_duration: 2,
      actual_sleep_duration: expect.any(Number),
    })
    expect((early.body as { actual_sleep_duration: number }).actual_sleep_duration).toBeLessThan(2)

    const active = await r.post(`/action/wakeup/${B}`)
    expect(active.status).toBe(409)
    expect(active.body).toEqual({ status: 'error', model: B, message: 'Model is already active' })

    expect((await r.get('/health')).body).toMatchObject({ models_active: 2, models_sleeping: 1 })

    r.clock.advance(2000)
    const woke = await r.post(`/action/wakeup/${enc(A)}`)
    expect(woke.status).toBe(200)
    expect(woke.body).toEqual({ status: 'success', model: A, message: 'Model woken up', timestamp: ISO })
    expect(
      (await r.get<{ models: Record<string, { status: string }> }>('/sleep/status')).body.models[A]!.status,
    ).toBe('active')
    expect(await (await fetch(`http://127.0.0.1:${a.port}/is_sleeping`)).json()).toEqual({
      is_sleeping: false,
    })
  })

  it('answers 502 with the error result when the engine does not answer', async () => {
    const res = await r.post(`/action/sleep/${GHOST}`)
    expect(res.status).toBe(502)
    expect(res.body).toEqual({
      status: 'error',
      model: GHOST,
      message: expect.stringContaining('connection'),
    })
    const unknown = await r.post('/action/wakeup/nope')
    expect(unknown.status).toBe(404)
    expect((unknown.body as { error: { code: string } }).error.code).toBe('model_not_found')
  })

  it('starts one wake for requests to a sleeping model and answers 503 model_waking meanwhile', async () => {
    expect((await r.post(`/action/sleep/${enc(A)}`)).status).toBe(200)
    const wakesBefore = engineHits(a, 'POST', '/wake_up')
    const first = await r.post('/v1/chat/completions', chat(A))
    expect(first.status).toBe(503)
    expect(first.body).toEqual({
      error: { message: expect.any(String), type: 'service_unavailable', code: 'model_waking' },
    })
    expect(Number(first.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    const status = await r.get<{ models: Record<string, { status: string }> }>('/sleep/status')
    expect(status.body.models[A]).toEqual({
      status: 'waking',
      sleep_time: ISO,
      sleep_duration: expect.any(Number),
      sleep_level: 1,
    } as never)
    const second = await r.post('/v1/chat/completions', chat(A))
    expect(second.status).toBe(503)
    expect((second.body as { error: { code: string } }).error.code).toBe('model_waking')
    const waking = await r.post(`/action/wakeup/${enc(A)}`)
    expect(waking.status).toBe(409)
    expect(waking.body).toEqual({ status: 'error', model: A, message: 'Model is already waking up' })

    await waitFor(
      'model awake',
      async () =>
        (await r.get<{ models: Record<string, { status: string }> }>('/sleep/status')).body.models[A]!
          .status === 'active',
      { timeoutMs: 5000 },
    )
    expect(engineHits(a, 'POST', '/wake_up') - wakesBefore).toBe(1)
    expect((await r.post('/v1/chat/completions', chat(A))).status).toBe(200)
  })

  it('lists sleep candidates and the auto-sleep settings', async () => {
    expect((await r.get('/sleep/candidates')).body).toEqual({
      candidates: [],
      auto_sleep_enabled: false,
      idle_threshold: 300,
    })
  })
})
