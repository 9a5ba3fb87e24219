import { afterAll, afterEach, beforeAll, describe, expect, it } from 'bun:test'
import { HttpStreamClient } from '../../plugins/benchmarks/http-stream.ts'
import { buildPrompts } from '../../plugins/benchmarks/prompts.ts'
import type { RequestSample } from '../../plugins/benchmarks/request.ts'
import { type LoadPlan, runScenarioLoad } from '../../plugins/benchmarks/runner.ts'
import { ScenarioRecorder, type Sla } from '../../plugins/benchmarks/statistics.ts'
import { type StubEngine, spawnStub } from '../perf/bench-stub.ts'
import { freePort } from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'

/** The load runner against a stub engine in a child process: failures, fallbacks, timeouts, loops. */
const stubs: StubEngine[] = []
let client: HttpStreamClient
let plain: StubEngine

const noSla: Sla = { e2eMs: null, ttftMs: null, tpotMs: null }

async function stub(extra: string[] = [], ttftMs = 5, tokensPerSec = 1000): Promise<StubEngine> {
  const s = await spawnStub({ ttftMs, tokensPerSec, extra })
  stubs.push(s)
  return s
}

function plan(base: string, over: Partial<LoadPlan> = {}): LoadPlan {
  return {
    url: new URL(`${base}/v1/completions`),
    headers: {},
    body: (i) =>
      JSON.stringify({
        model: 'stub',
        prompt: `request ${i} the of and`,
        max_tokens: 6,
        stream: true,
        stream_options: { include_usage: true },
      }),
    requestIdPrefix: 'test',
    concurrency: 2,
    warmupRequests: 1,
    totalRequests: 8,
    requestRate: null,
    requestTimeoutMs: 5000,
    ...over,
  }
}

beforeAll(async () => {
  plain = await stub()
})
afterEach(() => client?.close())
afterAll(() => {
  for (const s of stubs) s.stop()
})

describe('benchmark runner', () => {
  it('measures every request of a closed loop and reuses warm connections', async () => {
    client = new HttpStreamClient()
    const recorder = new ScenarioRecorder(noSla)
    const samples: RequestSample[] = []
    const ids: string[] = []
    const outcome = await runScenarioLoad(client, plan(plain.url), recorder, new AbortController().signal, {
      sample: (s, id) => {
        samples.push(s)
        ids.push(id)
      },
    })
    expect(outcome.cancelled).toBe(false)
    const m = recorder.summarize(outcome.durationSec)
    expect(m.successful_requests).toBe(8)
    expect(m.output_tokens_avg).toBe(6)
    expect(m.input_tokens_avg).toBe(5)
    expect(ids.sort()).toEqual(Array.from({ length: 8 }, (_, i) => `test-${i}`).sort())
    for (const s of samples) {
      expect(s.ttftMs).toBeGreaterThanOrEqual(4)
      // A request ends no sooner than its first token; on a busy machine all six can come in one read.
      expect(s.e2eMs).toBeGreaterThanOrEqual(s.ttftMs)
      expect(s.contentChunks).toBe(6)
    }
    const stats = await plain.stats()
    expect(Object.keys(stats)).toContain('test-w0')
  })

  it('counts failed requests in the totals and in the goodput denominator', async () => {
    const failing = await stub(['--fail-every', '4'])
    client = new HttpStreamClient()
    const recorder = new ScenarioRecorder({ e2eMs: 60_000, ttftMs: null, tpotMs: null })
    const outcome = await runScenarioLoad(
      client,
      plan(failing.url, { warmupRequests: 0 }),
      recorder,
      new AbortController().signal,
    )
    const m = recorder.summarize(outcome.durationSec)
    expect(m.total_requests).toBe(8)
    expect(m.failed_requests).toBe(2)
    expect(m.successful_requests).toBe(6)
    expect(m.errors).toEqual([{ message: 'HTTP 500: injected failure', count: 2 }])
    expect(m.goodput_count).toBe(6)
    expect(m.goodput_percent).toBe(75)
  })

  it('counts content chunks when the engine sends no usage', async () => {
    const bare = await stub(['--no-usage'])
    client = new HttpStreamClient()
    const recorder = new ScenarioRecorder(noSla)
    const outcome = await runScenarioLoad(client, plan(bare.url), recorder, new AbortController().signal)
    const m = recorder.summarize(outcome.durationSec)
    expect(m.output_tokens_avg).toBe(6)
    expect(m.usage_reported).toBe(false)
  })

  it('fails requests past the timeout and requests to a closed port', async () => {
    const sleepy = await stub([], 3000)
    client = new HttpStreamClient()
    const recorder = new ScenarioRecorder(noSla)
    const signal = new AbortController().signal
    await runScenarioLoad(
      client,
      plan(sleepy.url, { warmupRequests: 0, totalRequests: 2, requestTimeoutMs: 200 }),
      recorder,
      signal,
    )
    // Cut at the timeout (the stub answers after 3 s): the error says so, for both requests.
    expect(recorder.summarize(1).errors).toEqual([{ message: 'request timed out after 200 ms', count: 2 }])
    const closed = new ScenarioRecorder(noSla)
    const port = await freePort()
    await runScenarioLoad(client, plan(`http://127.0.0.1:${port}`, { warmupRequests: 0 }), closed, signal)
    expect(closed.summarize(1).failed_requests).toBe(8)
  })

  it('spaces open-loop arrivals at the request rate', async () => {
    client = new HttpStreamClient()
    const recorder = new ScenarioRecorder(noSla)
    const outcome = await runScenarioLoad(
      client,
      plan(plain.url, { warmupRequests: 0, totalRequests: 20, requestRate: 40, concurrency: 20 }),
      recorder,
      new AbortController().signal,
    )
    const m = recorder.summarize(outcome.durationSec)
    expect(m.successful_requests).toBe(20)
    // 20 Poisson arrivals at 40/s take about half a second: spaced, not sent at once. A floor only
    // (a busy machine makes the run longer, never shorter); how long it takes is not asserted.
    expect(outcome.durationSec).toBeGreaterThan(0.2)
  })

  it('stops at once when cancelled, counting in-flight requests as cancelled, not failed', async () => {
    const slow = await stub([], 5, 10)
    client = new HttpStreamClient()
    const recorder = new ScenarioRecorder(noSla)
    const ac = new AbortController()
    const running = runScenarioLoad(
      client,
      plan(slow.url, { warmupRequests: 0, body: () => '{"max_tokens":100,"stream":true}' }),
      recorder,
      ac.signal,
    )
    // Cancelled once both requests are streaming (100 tokens at 10/s: each has 10 s to go).
    await waitFor(
      'both requests to stream from the stub',
      async () => Object.values(await slow.stats()).filter((r) => r.chunks > 0).length === 2,
    )
    ac.abort()
    const outcome = await running
    expect(outcome.cancelled).toBe(true)
    // At once: both streams were cut, neither ran to its 100 tokens.
    const streamed = Object.values(await slow.stats()).map((r) => r.chunks)
    expect(streamed).toHaveLength(2)
    expect(streamed.every((n) => n > 0 && n < 100)).toBe(true)
    const m = recorder.summarize(outcome.durationSec)
    expect(m.cancelled_requests).toBe(2)
    expect(m.failed_requests).toBe(0)
  })
})

describe('benchmark prompts', () => {
  const opts = (engineUrl: string, target: number) => ({
    engineUrl,
    model: 'stub',
    target,
    signal: new AbortController().signal,
    timeoutMs: 5000,
  })

  it('builds prompts of exactly the asked size with the engine tokenizer, BOS included', async () => {
    const bos = await stub(['--bos', '1'])
    for (const target of [1, 7, 100, 1000]) {
      const p = await buildPrompts(opts(bos.url, target))
      expect(p.source).toBe('tokenize')
      expect(p.tokens).toBe(target)
      expect(p.note).toBeNull()
      expect(p.maxModelLen).toBe(8192)
      const words = p
        .prompt(5)
        .split(' ')
        .filter((w) => w !== '').length
      expect(words + 1).toBe(target)
    }
  })

  it('varies the word order per request but not the length', async () => {
    const p = await buildPrompts(opts(plain.url, 50))
    const a = p.prompt(1)
    const b = p.prompt(2)
    expect(a).not.toBe(b)
    expect(a.split(' ')[0]).toBe(b.split(' ')[0])
    expect(a.split(' ').sort()).toEqual(b.split(' ').sort())
  })

  it('estimates one token per word when the engine has no /tokenize, and says so', async () => {
    const bare = await stub(['--no-tokenize'])
    const p = await buildPrompts(opts(bare.url, 40))
    expect(p.source).toBe('estimate')
    expect(p.note).toContain('no /tokenize')
    expect(p.prompt(0).split(' ')).toHaveLength(40)
  })
})
