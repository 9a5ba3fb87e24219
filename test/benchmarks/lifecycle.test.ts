import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { BenchmarkRun } from '../../plugins/benchmarks/schemas.ts'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import type { TestHost } from '../support/host.ts'
import { readSse } from '../support/sse.ts'
import {
  api,
  bootHost,
  createRun,
  type FakeGateway,
  fakeGateway,
  getRun,
  instance,
  readEvents,
  type ScenarioInput,
  startSim,
  waitRun,
} from './support.ts'

/** Run lifecycle over HTTP: validation, the event stream, queueing, cancellation and deletion. */
let fast: EngineProc
let slow: EngineProc
let gw: FakeGateway
let th: TestHost

beforeAll(async () => {
  ;[fast, slow] = await Promise.all([
    startSim({ SIM_TOKENS_PER_SEC: '500', SIM_TTFT_MS: '20' }),
    startSim({ SIM_TOKENS_PER_SEC: '20', SIM_TTFT_MS: '0' }),
  ])
  gw = fakeGateway([
    instance('fast', fast.port),
    instance('slow', slow.port),
    instance('loading', fast.port, { status: 'starting' }),
  ])
  th = await bootHost(gw)
})

afterAll(async () => {
  await th?.stop()
  await cleanupSims()
})

const quick = (over: Partial<ScenarioInput> = {}): ScenarioInput => ({
  instanceId: 'fast',
  inputTokens: 8,
  outputTokens: 5,
  concurrency: 2,
  warmupRequests: 2,
  totalRequests: 6,
  ...over,
})
const long = (over: Partial<ScenarioInput> = {}): ScenarioInput =>
  quick({ instanceId: 'slow', outputTokens: 200, warmupRequests: 0, totalRequests: 4, ...over })

type ErrorBody = { error: { code: string; message: string; statusCode: number } }

describe('benchmark creation', () => {
  const post = (body: unknown) => api<ErrorBody>(th.url, 'POST', '/api/benchmarks', body)

  it('answers 201 with a pending run and pending scenarios in the spec shape', async () => {
    const res = await api<{ benchmark: BenchmarkRun }>(th.url, 'POST', '/api/benchmarks', {
      name: 'shape',
      mode: 'isolated',
      scenarios: [quick({ slaThresholdMs: 500 })],
    })
    expect(res.status).toBe(201)
    const run = res.body.benchmark
    expect(run).toMatchObject({
      name: 'shape',
      status: 'pending',
      mode: 'isolated',
      sharedcache_enabled: false,
    })
    expect(run.scenarios[0]).toMatchObject({
      instance_id: 'fast',
      routing_mode: 'direct',
      model_path: 'facebook/opt-125m',
      model_name: 'opt-125m',
      input_tokens: 8,
      output_tokens: 5,
      concurrency: 2,
      warmup_requests: 2,
      total_requests: 6,
      sla_threshold_ms: 500,
      status: 'pending',
    })
    expect(run.scenarios[0]!.metrics).toBeUndefined()
    await waitRun(th, run.id)
  })

  it.each([
    [
      'an unknown instance, naming the scenario',
      [quick(), quick({ instanceId: 'nope' })],
      /scenarios\[1\].*'nope'/,
    ],
    [
      'inputTokens + outputTokens above max_tokens',
      [quick({ inputTokens: 2000, outputTokens: 49 })],
      /scenarios\[0\].*2049 exceeds the model's max_tokens 2048/,
    ],
    ['an instance that is not active', [quick({ instanceId: 'loading' })], /scenarios\[0\].*starting/],
    ['a zero concurrency', [quick({ concurrency: 0 })], /concurrency/],
    ['a fractional token count', [quick({ inputTokens: 1.5 })], /inputTokens/],
    ['a concurrency above 4096', [quick({ concurrency: 5000 })], /concurrency/],
    ['a totalRequests above 100000', [quick({ totalRequests: 100_001 })], /totalRequests/],
    ['a negative warmup', [quick({ warmupRequests: -1 })], /warmupRequests/],
    ['an unknown routing mode', [{ ...quick(), routingMode: 'sideways' }], /routingMode/],
  ])('refuses %s with 400 VALIDATION_ERROR', async (_name, scenarios, message) => {
    const before = await api<{ total: number }>(th.url, 'GET', '/api/benchmarks')
    const res = await post({ mode: 'isolated', scenarios })
    expect(res.status).toBe(400)
    expect(res.body.error.code).toBe('VALIDATION_ERROR')
    expect(res.body.error.statusCode).toBe(400)
    expect(res.body.error.message).toMatch(message)
    const after = await api<{ total: number }>(th.url, 'GET', '/api/benchmarks')
    expect(after.body.total).toBe(before.body.total)
  })

  it('refuses a missing mode, an unknown mode and no scenarios', async () => {
    expect((await post({ scenarios: [quick()] })).status).toBe(400)
    expect((await post({ mode: 'isolated', scenarios: [] })).status).toBe(400)
    expect((await post({ mode: 'both', scenarios: [quick()] })).status).toBe(400)
  })
})

describe('benchmark event stream', () => {
  it('sends the spec events in order and closes after the run ends', async () => {
    const run = await createRun(th.url, 'isolated', [quick()])
    const events = await readEvents(`${th.url}/api/benchmarks/${run.id}/events`)
    const names = events.map((e) => e.event)
    expect(names[0]).toBe('benchmark:started')
    expect(names[1]).toBe('scenario:started')
    expect(names.at(-2)).toBe('scenario:completed')
    expect(names.at(-1)).toBe('benchmark:completed')
    const warm = events.filter((e) => e.event === 'scenario:warmup')
    expect(warm.at(-1)!.data).toMatchObject({ completed: 2, total: 2 })
    const progress = events.filter((e) => e.event === 'scenario:progress')
    expect(names.indexOf('scenario:progress')).toBeGreaterThan(names.lastIndexOf('scenario:warmup'))
    expect(progress.at(-1)!.data).toEqual({
      benchmark_id: run.id,
      scenario_id: run.scenarios[0]!.id,
      completed: 6,
      total: 6,
      success_count: 6,
      error_count: 0,
    })
    const completed = progress.map((e) => e.data.completed as number)
    expect([...completed].sort((a, b) => a - b)).toEqual(completed)
    const done = events.find((e) => e.event === 'scenario:completed')!
    expect(done.data.scenario_id).toBe(run.scenarios[0]!.id)
    expect((done.data.metrics as { total_requests: number }).total_requests).toBe(6)
    expect(events.at(-1)!.data).toMatchObject({
      benchmark_id: run.id,
      status: 'completed',
      successful_requests: 6,
    })
  })

  it('gives a late subscriber the current state first', async () => {
    const run = await createRun(th.url, 'isolated', [long({ totalRequests: 2 })])
    await waitRun(th, run.id, (r) => r.scenarios[0]!.phase === 'measuring')
    const res = await fetch(`${th.url}/api/benchmarks/${run.id}/events`)
    const first = await readSse(res, `run ${run.id}'s scenario:progress event`, (evs) =>
      evs.some((e) => e.event === 'scenario:progress'),
    )
    const text = first.map((e) => e.event).join('\n')
    expect(text.indexOf('benchmark:started')).toBeLessThan(text.indexOf('scenario:started'))
    expect(text.indexOf('scenario:started')).toBeLessThan(text.indexOf('scenario:progress'))
    await api(th.url, 'POST', `/api/benchmarks/${run.id}/cancel`)
    // after the end, the replay is the whole story and the stream closes by itself
    const replay = (await readEvents(`${th.url}/api/benchmarks/${run.id}/events`, 5000)).map((e) => e.event)
    expect(replay).toEqual([
      'benchmark:started',
      'scenario:started',
      'scenario:cancelled',
      'benchmark:cancelled',
    ])
  })

  it('answers 404 for an unknown run', async () => {
    const res = await api<ErrorBody>(th.url, 'GET', '/api/benchmarks/nope/events')
    expect(res.status).toBe(404)
    expect(res.body.error.code).toBe('BENCHMARK_NOT_FOUND')
  })
})

describe('benchmark cancellation and deletion', () => {
  it('cancels a running run at once, aborting in-flight requests', async () => {
    const run = await createRun(th.url, 'isolated', [long()])
    const events = readEvents(`${th.url}/api/benchmarks/${run.id}/events`)
    await waitRun(th, run.id, (r) => r.scenarios[0]!.phase === 'measuring')
    const res = await api<{ benchmark: BenchmarkRun }>(th.url, 'POST', `/api/benchmarks/${run.id}/cancel`)
    expect(res.status).toBe(200)
    const cancelled = res.body.benchmark
    expect(cancelled.status).toBe('cancelled')
    expect(cancelled.error).toBe('cancelled by request')
    expect(cancelled.completed_at).not.toBeNull()
    const s = cancelled.scenarios[0]!
    expect(s.status).toBe('cancelled')
    expect(s.metrics!.cancelled_requests).toBe(2)
    expect(s.metrics!.total_requests).toBe(0)
    expect((await events).at(-1)!.event).toBe('benchmark:cancelled')
    expect((await getRun(th.url, run.id)).status).toBe('cancelled')
    const again = await api<ErrorBody>(th.url, 'POST', `/api/benchmarks/${run.id}/cancel`)
    expect(again.status).toBe(409)
    expect(again.body.error.code).toBe('BENCHMARK_NOT_ACTIVE')
  })

  it('queues runs beyond max_concurrent_runs as pending and cancels a queued one before it starts', async () => {
    const first = await createRun(th.url, 'isolated', [long()])
    const second = await createRun(th.url, 'isolated', [quick()])
    await waitRun(th, first.id, (r) => r.status === 'running')
    expect((await getRun(th.url, second.id)).status).toBe('pending')
    const listed = await api<{ benchmarks: { id: string; status: string }[] }>(
      th.url,
      'GET',
      '/api/benchmarks?status=pending',
    )
    expect(listed.body.benchmarks.map((b) => b.id)).toContain(second.id)
    const res = await api<{ benchmark: BenchmarkRun }>(th.url, 'POST', `/api/benchmarks/${second.id}/cancel`)
    expect(res.body.benchmark.status).toBe('cancelled')
    expect(res.body.benchmark.started_at).toBeNull()
    expect(res.body.benchmark.scenarios[0]!.status).toBe('cancelled')
    await api(th.url, 'POST', `/api/benchmarks/${first.id}/cancel`)
  })

  it('deletes a running run after cancelling it, then answers 404', async () => {
    const run = await createRun(th.url, 'contention', [
      long(),
      long({ instanceId: 'fast', outputTokens: 2000 - 8 }),
    ])
    await waitRun(th, run.id, (r) => r.status === 'running')
    const res = await api(th.url, 'DELETE', `/api/benchmarks/${run.id}`)
    expect(res.status).toBe(200)
    expect(res.body).toEqual({ id: run.id, deleted: true, cancelled: true })
    expect((await api(th.url, 'GET', `/api/benchmarks/${run.id}`)).status).toBe(404)
    expect((await api(th.url, 'DELETE', `/api/benchmarks/${run.id}`)).status).toBe(404)
  })

  it('deletes a finished run', async () => {
    const run = await createRun(th.url, 'isolated', [quick({ warmupRequests: 0, totalRequests: 1 })])
    await waitRun(th, run.id)
    const res = await api(th.url, 'DELETE', `/api/benchmarks/${run.id}`)
    expect(res.body).toEqual({ id: run.id, deleted: true, cancelled: false })
    expect((await api(th.url, 'GET', `/api/benchmarks/${run.id}`)).status).toBe(404)
  })

  it('fails a scenario whose instance disappeared and still runs the others', async () => {
    gw.instances.set('vanishing', instance('vanishing', fast.port))
    const run = await createRun(th.url, 'isolated', [quick(), quick({ instanceId: 'vanishing' })])
    gw.instances.delete('vanishing')
    const done = await waitRun(th, run.id)
    expect(done.status).toBe('failed')
    expect(done.error).toContain("scenario 2 (instance 'vanishing')")
    expect(done.scenarios[0]!.status).toBe('completed')
    expect(done.scenarios[1]).toMatchObject({
      status: 'failed',
      error: "instance 'vanishing' no longer exists",
    })
    expect(done.scenarios[1]!.metrics).toBeUndefined()
  })
})
