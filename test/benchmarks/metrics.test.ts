import { describe, expect, it } from 'bun:test'
import type { RequestSample } from '../../plugins/benchmarks/request.ts'
import { classifyData, SseLineReader, type SseSink } from '../../plugins/benchmarks/sse-scan.ts'
import { mean, percentile, Reservoir, ScenarioRecorder } from '../../plugins/benchmarks/statistics.ts'

/** Statistics and SSE scanning, checked against hand-computed values. */
const sample = (over: Partial<RequestSample>): RequestSample => ({
  ok: true,
  error: null,
  cancelled: false,
  sendAt: 0,
  endAt: 0,
  ttftMs: 100,
  e2eMs: 200,
  outputTokens: 11,
  promptTokens: 32,
  usageReported: true,
  status: 200,
  contentChunks: 11,
  ...over,
})

describe('benchmark statistics', () => {
  it('interpolates percentiles linearly between closest ranks, like numpy', () => {
    const v = [1, 2, 3, 4]
    expect(percentile(v, 50)).toBe(2.5)
    expect(percentile(v, 90)).toBeCloseTo(3.7, 10)
    expect(percentile(v, 99)).toBeCloseTo(3.97, 10)
    expect(percentile(v, 0)).toBe(1)
    expect(percentile(v, 100)).toBe(4)
    expect(percentile([7], 95)).toBe(7)
    expect(percentile([], 50)).toBe(0)
    expect(mean([1, 2, 6])).toBe(3)
  })

  it('derives TPS, TPOT and throughput as vllm bench serve does', () => {
    const r = new ScenarioRecorder({ e2eMs: null, ttftMs: null, tpotMs: null })
    // 11 tokens, decode 100 ms → TPS 110, TPOT 10 ms
    r.add(sample({}))
    r.add(sample({ ttftMs: 50, e2eMs: 250, outputTokens: 21 }))
    const m = r.summarize(2)
    expect(m.tps_p50).toBeCloseTo((110 + 105) / 2, 6)
    expect(m.tpot_avg).toBeCloseTo(10, 6)
    expect(m.ttft_avg).toBe(75)
    expect(m.e2e_p50).toBe(225)
    // wall-clock throughput: 2 requests and 32 tokens over 2 s, not over the latency sum
    expect(m.requests_per_second).toBe(1)
    expect(m.tokens_per_second_total).toBe(16)
    expect(m.total_tokens_per_second).toBe(48)
    expect(m.output_tokens_total).toBe(32)
  })

  it('counts goodput over every measured request, failed ones included', () => {
    const r = new ScenarioRecorder({ e2eMs: 300, ttftMs: null, tpotMs: 16 })
    r.add(sample({ e2eMs: 250 })) // good: TPOT 15 ms
    r.add(sample({ e2eMs: 350 })) // misses E2E
    r.add(sample({ e2eMs: 290, ttftMs: 50 })) // TPOT = 24 ms: misses TPOT
    r.add(sample({ ok: false, error: 'HTTP 500: boom' }))
    r.add(sample({ ok: false, cancelled: true, error: 'cancelled' }))
    const m = r.summarize(1)
    expect(m.goodput_count).toBe(1)
    expect(m.goodput_percent).toBe(25)
    expect(m.total_requests).toBe(4)
    expect(m.failed_requests).toBe(1)
    expect(m.cancelled_requests).toBe(1)
    expect(m.errors).toEqual([{ message: 'HTTP 500: boom', count: 1 }])
    expect(m.ttft_avg).toBe(Math.round(((100 + 100 + 50) / 3) * 1000) / 1000)
  })

  it('reports zeros, not NaN, when nothing succeeded', () => {
    const r = new ScenarioRecorder({ e2eMs: 100, ttftMs: null, tpotMs: null })
    r.add(sample({ ok: false, error: 'x' }))
    const m = r.summarize(0)
    for (const [k, v] of Object.entries(m))
      if (typeof v === 'number') expect(Number.isFinite(v), k).toBe(true)
    expect(m.goodput_percent).toBe(0)
  })

  it('keeps a bounded uniform sample of inter-token gaps', () => {
    const res = new Reservoir(1000, 7)
    for (let i = 0; i < 100_000; i++) res.add(i)
    const s = res.sorted()
    expect(s).toHaveLength(1000)
    expect(res.count).toBe(100_000)
    expect(percentile(s, 50)).toBeGreaterThan(40_000)
    expect(percentile(s, 50)).toBeLessThan(60_000)
  })
})

describe('SSE scanning', () => {
  const sink = () => {
    const seen = {
      content: [] as number[],
      usage: [] as (number | null)[][],
      errors: [] as string[],
      done: 0,
    }
    const s: SseSink = {
      content: (at) => seen.content.push(at),
      usage: (p, c) => seen.usage.push([p, c]),
      error: (m) => seen.errors.push(m),
      done: () => seen.done++,
    }
    return { seen, s }
  }

  it('finds content chunks of completions and chat streams, not role-only or empty ones', () => {
    const { seen, s } = sink()
    classifyData('{"choices":[{"index":0,"text":"hi","finish_reason":null}]}', 1, s)
    classifyData('{"choices":[{"index":0,"text":"","finish_reason":"length"}]}', 2, s)
    classifyData('{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', 3, s)
    classifyData('{"choices":[{"index":0,"delta":{"content":"x"}}]}', 4, s)
    classifyData('{"choices":[{"delta":{"reasoning_content":"think"}}]}', 5, s)
    classifyData('{"choices": [{"delta": {"content": null}}]}', 6, s)
    classifyData('{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}', 7, s)
    classifyData('{"error":{"message":"engine exploded","code":500}}', 8, s)
    classifyData('[DONE]', 9, s)
    expect(seen.content).toEqual([1, 4, 5])
    expect(seen.usage).toEqual([[5, 9]])
    expect(seen.errors).toEqual(['engine exploded'])
    expect(seen.done).toBe(1)
  })

  it('reassembles lines split anywhere across reads, with LF or CRLF', () => {
    const { seen, s } = sink()
    const reader = new SseLineReader(s)
    const text =
      'data: {"choices":[{"text":"a"}]}\n\n: comment\r\n\r\ndata:{"choices":[{"text":"b"}]}\r\n\r\n' +
      'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
    for (let i = 0; i < text.length; i++) reader.push(text[i]!, i)
    reader.finish(text.length)
    expect(seen.content).toHaveLength(2)
    expect(seen.usage).toEqual([[1, 2]])
    expect(seen.done).toBe(1)
  })
})

describe('inter-token latency', () => {
  it('counts the gaps of successful requests only, with an exact mean', () => {
    const r = new ScenarioRecorder({ e2eMs: null, ttftMs: null, tpotMs: null })
    r.add(sample({ itlGaps: [10, 20] }))
    r.add(sample({ ok: false, error: 'HTTP 500: boom', itlGaps: [1000, 1000] }))
    r.add(sample({ cancelled: true, ok: false, error: 'cancelled', itlGaps: [5000] }))
    const m = r.summarize(1)
    expect(m.itl_avg).toBe(15)
    expect(m.itl_p99).toBeLessThanOrEqual(20)
  })
})
