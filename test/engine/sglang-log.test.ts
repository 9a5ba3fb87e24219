import { describe, expect, it } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { MemoryMetrics } from '../../src/engine/engine-logs.ts'
import { parseSglangLine, SglangLogAccumulator, splitSglangLine } from '../../src/engine/sglang-log.ts'

/**
 * SGLang's output as the gateway reads it: the timestamp and rank prefix, each memory line in its
 * older and newer forms, the readiness hint (the line after the warmup, not uvicorn's start), and
 * whole start-up logs from test/fixtures/sglang/ (sources in its README).
 */
describe('splitSglangLine', () => {
  it('strips the timestamp, the rank prefix and uvicorn level, in either date form', () => {
    expect(splitSglangLine('[2025-01-14 09:12:14 TP0] Memory pool end. avail mem=9.42 GB')).toEqual({
      rank: 'TP0',
      message: 'Memory pool end. avail mem=9.42 GB',
    })
    expect(splitSglangLine('[11-05 14:02:13 TP1 EP1] KV Cache is allocated.')).toEqual({
      rank: 'TP1 EP1',
      message: 'KV Cache is allocated.',
    })
    expect(splitSglangLine('[11-05 14:02:25] INFO:     Application startup complete.')).toEqual({
      rank: null,
      message: 'Application startup complete.',
    })
    expect(splitSglangLine('\u001b[32m[2025-01-14 09:12:14]\u001b[0m plain')).toEqual({
      rank: null,
      message: 'plain',
    })
  })
})

describe('parseSglangLine', () => {
  it('reads the weights line, older and newer', () => {
    expect(
      parseSglangLine(
        '[2025-01-14 09:12:14 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.54 GB, mem usage=15.04 GB.',
      ),
    ).toEqual({ kind: 'weights', gib: 15.04, availGib: 63.54, rank: 'TP0' })
    expect(
      parseSglangLine(
        '[11-05 14:02:13 TP0] Load weight end. elapsed=2.74 s, type=Qwen2ForCausalLM, quant=fp8, avail mem=71.21 GB, mem usage=7.10 GB.',
      ),
    ).toEqual({ kind: 'weights', gib: 7.1, availGib: 71.21, rank: 'TP0' })
  })

  it('sums K and V (MHA), takes the one KV figure (MLA)', () => {
    expect(
      parseSglangLine('[d] KV Cache is allocated. #tokens: 443272, K size: 27.06 GB, V size: 27.06 GB'),
    ).toBeNull()
    expect(
      parseSglangLine(
        '[2025-01-14 09:12:14 TP0] KV Cache is allocated. #tokens: 443272, K size: 27.06 GB, V size: 27.06 GB',
      ),
    ).toEqual({ kind: 'kv_cache', tokens: 443272, gib: 54.12, rank: 'TP0' })
    expect(
      parseSglangLine(
        '[2025-09-18 07:30:31 TP0 EP0] KV Cache is allocated. #tokens: 1810558, KV size: 52.45 GB',
      ),
    ).toEqual({ kind: 'kv_cache', tokens: 1810558, gib: 52.45, rank: 'TP0 EP0' })
  })

  it('reads CUDA graphs with and without figures, and the scheduler summary', () => {
    expect(
      parseSglangLine('[2025-01-14 09:12:21 TP0] Capture cuda graph end. Time elapsed: 7.14 s'),
    ).toMatchObject({
      kind: 'graphs',
      gib: null,
      availGib: null,
    })
    expect(
      parseSglangLine(
        '[11-05 14:02:24 TP0] Capture cuda graph end. Time elapsed: 9.85 s. mem usage=0.94 GB. avail mem=9.25 GB.',
      ),
    ).toMatchObject({ kind: 'graphs', gib: 0.94, availGib: 9.25 })
    expect(
      parseSglangLine(
        '[11-05 14:02:24 TP0] max_total_num_tokens=2284858, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=2048, context_len=32768, available_gpu_mem=9.25 GB',
      ),
    ).toMatchObject({ kind: 'scheduler', maxTotalTokens: 2284858, contextLen: 32768, availGib: 9.25 })
  })

  it("takes the line after the warmup as the readiness hint, not uvicorn's start", () => {
    const acc = new SglangLogAccumulator()
    expect(acc.observe('[11-05 14:02:25] INFO:     Application startup complete.')).toBe(false)
    expect(acc.phase()).toBe('api_server')
    expect(acc.observe('[11-05 14:02:26] The server is fired up and ready to roll!')).toBe(true)
    expect(acc.phase()).toBe('ready')
    expect(acc.progressPercent()).toBe(100)
  })

  it('prefers the cause over the wrappers around it', () => {
    const acc = new SglangLogAccumulator()
    for (const line of [
      '[2025-01-14 10:41:02 TP0] Scheduler hit an exception: Traceback (most recent call last):',
      '  File "/x/model_runner.py", line 632, in init_memory_pool',
      'RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.',
      '[2025-01-14 10:41:02] Received sigquit from a child process. It usually means the child failed.',
    ])
      acc.observe(line)
    expect(acc.startupFailure()).toBe(
      'RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.',
    )
    expect(acc.lastErrorLines(5)).toHaveLength(3)
  })
})

const FIXTURES = join(import.meta.dir, '..', 'fixtures', 'sglang')

interface Expected {
  metrics: MemoryMetrics | null
  maxModelLen: number | null
  kvTokens: number | null
  phase: string
  failure: string | null
}

const EXPECTED: Record<string, Record<string, Expected>> = {
  'sglang-0.4.log': {
    'llama-3.1-8b': {
      metrics: {
        total_gpu_memory_gib: 69.91,
        weights_memory_gib: 15.04,
        cuda_graph_memory_gib: 0,
        overhead_memory_gib: 0.75,
        kv_cache_available_gib: 54.12,
        kv_cache_per_request_mib: 16386.9214,
        max_model_len: 131072,
      },
      maxModelLen: 131072,
      kvTokens: 443272,
      phase: 'ready',
      failure: null,
    },
    'not-enough-memory': {
      metrics: null,
      maxModelLen: null,
      kvTokens: null,
      phase: 'profiling',
      failure: 'RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.',
    },
  },
  'sglang-0.5.log': {
    'qwen2.5-7b-tp2': {
      metrics: {
        total_gpu_memory_gib: 69.06,
        weights_memory_gib: 7.1,
        cuda_graph_memory_gib: 0.94,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 61.02,
        kv_cache_per_request_mib: 896.1132,
        max_model_len: 32768,
      },
      maxModelLen: 32768,
      kvTokens: 2284858,
      phase: 'ready',
      failure: null,
    },
    'deepseek-v2-lite-mla': {
      metrics: {
        total_gpu_memory_gib: 69.42,
        weights_memory_gib: 15.76,
        cuda_graph_memory_gib: 1.21,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 52.45,
        kv_cache_per_request_mib: 4860.1866,
        max_model_len: 163840,
      },
      maxModelLen: 163840,
      kvTokens: 1810558,
      phase: 'api_server',
      failure: null,
    },
    'unrecognized-flag': {
      metrics: null,
      maxModelLen: null,
      kvTokens: null,
      phase: 'starting',
      failure: 'launch_server.py: error: unrecognized arguments: --enable-sleep-mode',
    },
  },
}

function fixtureEngines(file: string): Map<string, string[]> {
  const engines = new Map<string, string[]>()
  let current: string[] | null = null
  for (const line of readFileSync(join(FIXTURES, file), 'utf8').split('\n')) {
    const head = /^### engine: (.+)$/.exec(line)
    if (head) {
      current = []
      engines.set(head[1]!, current)
    } else if (current && line !== '') current.push(line)
  }
  return engines
}

describe('SGLang start-up logs (test/fixtures/sglang)', () => {
  it('has an expectation for every fixture file and every engine in it', () => {
    const files = readdirSync(FIXTURES).filter((f) => f.endsWith('.log'))
    expect(files.sort()).toEqual(Object.keys(EXPECTED).sort())
    for (const file of files)
      expect([...fixtureEngines(file).keys()]).toEqual(Object.keys(EXPECTED[file] ?? {}))
  })

  for (const [file, engines] of Object.entries(EXPECTED)) {
    for (const [engine, want] of Object.entries(engines)) {
      it(`${file} ${engine}`, () => {
        const acc = new SglangLogAccumulator()
        const lines = fixtureEngines(file).get(engine) ?? []
        expect(lines.length).toBeGreaterThan(0)
        let hints = 0
        for (const line of lines) if (acc.observe(line)) hints++
        expect(acc.metrics()).toEqual(want.metrics)
        expect(acc.maxModelLen()).toBe(want.maxModelLen)
        expect(acc.kvCacheTokens()).toBe(want.kvTokens)
        expect(acc.phase()).toBe(want.phase as ReturnType<SglangLogAccumulator['phase']>)
        expect(acc.startupFailure()).toBe(want.failure)
        expect(hints).toBe(want.phase === 'ready' ? 1 : 0)
      })
    }
  }
})
