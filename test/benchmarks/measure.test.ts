import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import type { TestHost } from '../support/host.ts'
import {
  bootHost,
  createRun,
  type FakeGateway,
  fakeGateway,
  instance,
  readEvents,
  startSim,
  waitRun,
} from './support.ts'

/**
 * Real scenarios against simulator engines told to stream at a known rate after a known delay;
 * the metrics must agree with what the simulator was told to do.
 */
const TPS = 200
const TTFT_MS = 100
let steady: EngineProc
let queued: EngineProc
let gw: FakeGateway
let th: TestHost

beforeAll(async () => {
  ;[steady, queued] = await Promise.all([
    startSim({ SIM_TOKENS_PER_SEC: String(TPS), SIM_TTFT_MS: String(TTFT_MS) }),
    // two sequences at a time: of four simultaneous requests, two wait a whole request for a slot
    startSim({ SIM_TOKENS_PER_SEC: '400', SIM_TTFT_MS: '60' }, ['--max-num-seqs', '2']),
  ])
  gw = fakeGateway([instance('steady', steady.port), instance('queued', queued.port)])
  th = await bootHost(gw, { env: { INFERENCE_API_KEY: 'sk-bench' } })
})

afterAll(async () => {
  await th?.stop()
  await cleanupSims()
})

describe('benchmark measurement', () => {
  it('measures output size, TTFT, TPS and E2E as the simulator was configured', async () => {
    const created = await createRun(th.url, 'isolated', [
      {
        instanceId: 'steady',
        inputTokens: 48,
        outputTokens: 20,
        concurrency: 4,
        warmupRequests: 2,
        totalRequests: 8,
      },
    ])
    expect(created.status).toBe('pending')
    expect(created.scenarios[0]!.status).toBe('pending')
    const run = await waitRun(th, created.id)
    expect(run.status).toBe('completed')
    const s = run.scenarios[0]!
    expect(s.status).toBe('completed')
    expect(s.prompt_source).toBe('tokenize')
    expect(s.prompt_tokens).toBe(48)
    const m = s.metrics!
    expect(m.total_requests).toBe(8)
    expect(m.successful_requests).toBe(8)
    expect(m.failed_requests).toBe(0)
    // sizes are exactly what was asked, per the engine's own usage counters
    expect(m.output_tokens_avg).toBe(20)
    expect(m.output_tokens_total).toBe(160)
    expect(m.input_tokens_avg).toBe(48)
    expect(m.usage_reported).toBe(true)
    // TTFT is at least the simulator's delay (whose ms timers may fire a fraction early), and not much more
    expect(m.ttft_min).toBeGreaterThanOrEqual(TTFT_MS - 1)
    expect(m.ttft_p50).toBeGreaterThanOrEqual(TTFT_MS - 1)
    expect(m.ttft_p50).toBeLessThan(TTFT_MS + 80)
    // per-request TPS = 20 tokens ÷ (19 gaps at 1/200 s) ≈ 210.5; TPOT = 5 ms
    const expectedTps = (20 * TPS) / 19
    expect(m.tps_p50).toBeGreaterThan(expectedTps * 0.8)
    expect(m.tps_p50).toBeLessThan(expectedTps * 1.15)
    expect(m.tpot_p50).toBeGreaterThan(4.3)
    expect(m.tpot_p50).toBeLessThan(6.3)
    expect(m.itl_avg).toBeGreaterThan(3.5)
    expect(m.itl_avg).toBeLessThan(7)
    // E2E ≈ TTFT + 19 × 5 ms
    expect(m.e2e_p50).toBeGreaterThan(TTFT_MS + 19 * 5 - 5)
    expect(m.e2e_p50).toBeLessThan(TTFT_MS + 19 * 5 + 100)
    expect(m.ttft_p50).toBeLessThanOrEqual(m.ttft_p90!)
    expect(m.ttft_p90).toBeLessThanOrEqual(m.ttft_p99!)
    // throughput over wall clock: 8 requests in 2 waves of 4 → ≈ 2 × E2E
    expect(m.duration_seconds).toBeGreaterThan((2 * m.e2e_min!) / 1000 - 0.01)
    // (rates times the stored duration, which is rounded: dividing by it would scale that rounding)
    expect(m.requests_per_second * m.duration_seconds).toBeCloseTo(8, 1)
    expect(m.tokens_per_second_total * m.duration_seconds).toBeCloseTo(160, 0)
    // no SLA: every successful request is good
    expect(m.goodput_count).toBe(8)
    expect(m.goodput_percent).toBe(100)
    expect(run.total_requests).toBe(8)
    expect(run.successful_requests).toBe(8)
    expect(run.duration_seconds).toBeGreaterThan(0)
  })

  it('splits goodput when half the requests miss the E2E SLA', async () => {
    // E ≈ 60 + 9 × 2.5 ≈ 83 ms for the two admitted at once; the other two wait one E in the queue
    const created = await createRun(th.url, 'isolated', [
      {
        instanceId: 'queued',
        inputTokens: 16,
        outputTokens: 10,
        concurrency: 4,
        warmupRequests: 0,
        totalRequests: 4,
        slaThresholdMs: 125,
      },
    ])
    const run = await waitRun(th, created.id)
    const m = run.scenarios[0]!.metrics!
    expect(m.successful_requests).toBe(4)
    expect(m.e2e_max).toBeGreaterThan(1.5 * m.e2e_min!)
    expect(m.goodput_count).toBe(2)
    expect(m.goodput_percent).toBe(50)
    expect(m.sla_threshold_ms).toBe(125)
  })

  it('applies the optional TTFT SLA too', async () => {
    const created = await createRun(th.url, 'isolated', [
      {
        instanceId: 'steady',
        inputTokens: 8,
        outputTokens: 4,
        concurrency: 2,
        warmupRequests: 0,
        totalRequests: 2,
        slaThresholdMs: 10_000,
        slaTtftMs: TTFT_MS / 2,
      },
    ])
    const m = (await waitRun(th, created.id)).scenarios[0]!.metrics!
    expect(m.goodput_count).toBe(0)
    expect(m.goodput_percent).toBe(0)
  })

  it('routes proxy scenarios through the gateway /v1 with the inference API key', async () => {
    const before = gw.proxied.get('Bearer sk-bench') ?? 0
    const created = await createRun(th.url, 'isolated', [
      {
        instanceId: 'steady',
        routingMode: 'proxy',
        inputTokens: 8,
        outputTokens: 5,
        concurrency: 2,
        warmupRequests: 1,
        totalRequests: 4,
      },
    ])
    const run = await waitRun(th, created.id)
    const s = run.scenarios[0]!
    expect(s.routing_mode).toBe('proxy')
    expect(s.metrics!.successful_requests).toBe(4)
    expect(s.metrics!.output_tokens_avg).toBe(5)
    expect((gw.proxied.get('Bearer sk-bench') ?? 0) - before).toBe(5)
  })

  it('runs isolated scenarios one after another and contention scenarios at once', async () => {
    const scenario = (instanceId: string) => ({
      instanceId,
      inputTokens: 8,
      outputTokens: 10,
      concurrency: 2,
      warmupRequests: 1,
      totalRequests: 4,
    })
    const iso = await createRun(th.url, 'isolated', [scenario('steady'), scenario('queued')])
    const isoEvents = readEvents(`${th.url}/api/benchmarks/${iso.id}/events`)
    const isoRun = await waitRun(th, iso.id)
    const [a, b] = isoRun.scenarios
    expect(Date.parse(b!.started_at!)).toBeGreaterThanOrEqual(Date.parse(a!.completed_at!))
    const order = (await isoEvents).map((e) => `${e.event}:${e.data.scenario_id === a!.id ? 'a' : 'b'}`)
    expect(order.indexOf('scenario:completed:a')).toBeLessThan(order.indexOf('scenario:started:b'))

    const con = await createRun(th.url, 'contention', [scenario('steady'), scenario('queued')])
    const conEvents = readEvents(`${th.url}/api/benchmarks/${con.id}/events`)
    const conRun = await waitRun(th, con.id)
    const [c, d] = conRun.scenarios
    expect(conRun.status).toBe('completed')
    expect(Date.parse(d!.started_at!)).toBeLessThan(Date.parse(c!.completed_at!))
    expect(Date.parse(c!.started_at!)).toBeLessThan(Date.parse(d!.completed_at!))
    const names = (await conEvents).map((e) => `${e.event}:${e.data.scenario_id === c!.id ? 'c' : 'd'}`)
    const firstDone = Math.min(names.indexOf('scenario:completed:c'), names.indexOf('scenario:completed:d'))
    expect(names.indexOf('scenario:started:c')).toBeLessThan(firstDone)
    expect(names.indexOf('scenario:started:d')).toBeLessThan(firstDone)
    // measured phases start together: each scenario's first progress event comes after both warmups
    const lastWarm = Math.max(names.lastIndexOf('scenario:warmup:c'), names.lastIndexOf('scenario:warmup:d'))
    expect(names.indexOf('scenario:progress:c')).toBeGreaterThan(lastWarm)
    expect(names.indexOf('scenario:progress:d')).toBeGreaterThan(lastWarm)
  })
})
