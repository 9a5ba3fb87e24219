import { describe, expect, it } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { MemoryMetrics } from '../../src/engine/engine-logs.ts'
import { sglangDriver } from '../../src/engine/sglang-driver.ts'
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
    ).toEqual({ kind: 'kv_cache', tokens: 443272, gib: 54.12, dtype: null, rank: 'TP0' })
    expect(
      parseSglangLine(
        '[2025-09-18 07:30:31 TP0 EP0] KV Cache is allocated. #tokens: 1810558, KV size: 52.45 GB',
      ),
    ).toEqual({ kind: 'kv_cache', tokens: 1810558, gib: 52.45, dtype: null, rank: 'TP0 EP0' })
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

describe('parseSglangLine, current builds (0.5.15–0.5.18)', () => {
  const at = (message: string, rank = 'TP0') => parseSglangLine(`[2026-11-24 09:14:22 ${rank}] ${message}`)

  it('reads the KV line with its dtype, K and V (MHA) or one KV figure (MLA)', () => {
    expect(
      at('KV Cache is allocated. dtype: torch.bfloat16, #tokens: 535124, K size: 16.33 GB, V size: 16.33 GB'),
    ).toEqual({ kind: 'kv_cache', tokens: 535124, gib: 32.66, dtype: 'torch.bfloat16', rank: 'TP0' })
    expect(
      at('KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 1226984, KV size: 9.21 GB', 'TP1 EP1'),
    ).toEqual({ kind: 'kv_cache', tokens: 1226984, gib: 9.21, dtype: 'torch.float8_e4m3fn', rank: 'TP1 EP1' })
  })

  it("reads a hybrid model's Mamba state, every size it names, and the sliding-window pool", () => {
    expect(
      at(
        'Mamba Cache is allocated. max_mamba_cache_size: 117, conv_state size: 0.28GB, ssm_state size: 8.07GB ',
      ),
    ).toEqual({ kind: 'mamba_cache', slots: 117, gib: 8.35, rank: 'TP0' })
    expect(
      at(
        'Mamba Cache is allocated. max_mamba_cache_size: 48, conv_state size: 0.10GB, ssm_state size: 2.00GB ' +
          'intermediate_ssm_state_cache size: 1.20GB intermediate_conv_window_cache size: 0.05GB ',
      ),
    ).toMatchObject({ kind: 'mamba_cache', slots: 48, gib: 3.35 })
    expect(
      at(
        'Mamba Cache (spec) is allocated. max_mamba_cache_size: 8, conv_state size: 0.01GB, ssm_state size: 0.50GB, ' +
          'ssm_spec_cache size: 0.25GB, intermediate_conv_window_cache size: 0.02GB',
      ),
    ).toMatchObject({ kind: 'mamba_cache', slots: 8, gib: 0.78 })
    expect(at('SWAKVPool mem usage: 36.69 GB, swa size: 171008, full size: 213761')).toEqual({
      kind: 'swa_kv_pool',
      gib: 36.69,
      swaTokens: 171008,
      fullTokens: 213761,
      rank: 'TP0',
    })
  })

  it('reads each CUDA graph set, its begin and end, with a negative mem usage kept as printed', () => {
    expect(
      at(
        'Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4], avail mem=12.41 GB',
      ),
    ).toEqual({ kind: 'graphs_begin', graph: 'target decode', availGib: 12.41, rank: 'TP0' })
    expect(
      at(
        'Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 8192], avail mem=9.10 GB',
      ),
    ).toMatchObject({ kind: 'graphs_begin', graph: 'target prefill', availGib: 9.1 })
    expect(
      at('Capture target decode CUDA graph end. elapsed=30.54 s, mem usage=1.38 GB, avail mem=19.66 GB.'),
    ).toEqual({
      kind: 'graphs',
      graph: 'target decode',
      seconds: 30.54,
      gib: 1.38,
      availGib: 19.66,
      rank: 'TP0',
    })
    expect(
      at('Capture draft verify CUDA graph end. elapsed=4.26 s, mem usage=-0.01 GB, avail mem=7.68 GB.'),
    ).toEqual({
      kind: 'graphs',
      graph: 'draft verify',
      seconds: 4.26,
      gib: -0.01,
      availGib: 7.68,
      rank: 'TP0',
    })
    expect(at('Capture target verify CUDA graph end. elapsed=64.96 s', 'TP1')).toMatchObject({
      kind: 'graphs',
      graph: 'target verify',
      gib: null,
      availGib: null,
    })
    // The older pair still reads.
    expect(
      at('Capture cuda graph begin. This can take up to several minutes. avail mem=10.19 GB'),
    ).toMatchObject({
      kind: 'graphs_begin',
      graph: null,
      availGib: 10.19,
    })
  })

  it("reads a draft's weights line, a negative figure kept as printed", () => {
    expect(
      at(
        'Load weight end. elapsed=94.49 s, type=Qwen4ExpForCausalLMMTP, quant=modelopt_fp4, quant_algo=NVFP4, avail mem=30.67 GB, mem usage=-1.86 GB.',
      ),
    ).toEqual({ kind: 'weights', gib: -1.86, availGib: 30.67, rank: 'TP0' })
  })

  it('reads the start-up timings, the CUDA-graph phases by name, any phase missing', () => {
    expect(
      parseSglangLine(
        '[2026-09-11 23:46:50] Engine startup timings (s): load_weight=616.34, kv_cache_allocation=6.68, scheduler_e2e=761.30, cuda_graph={prefill=0.00, decode=0.00, target_verify=13.48, draft_prefill=0.00, draft_decode=4.26, draft_extend=0.00}, tokenizer_e2e=766.76',
      ),
    ).toEqual({
      kind: 'startup_timings',
      totalSeconds: 766.76,
      loadWeightsSeconds: 616.34,
      phases: {
        load_weight: 616.34,
        kv_cache_allocation: 6.68,
        scheduler_e2e: 761.3,
        'cuda_graph.prefill': 0,
        'cuda_graph.decode': 0,
        'cuda_graph.target_verify': 13.48,
        'cuda_graph.draft_prefill': 0,
        'cuda_graph.draft_decode': 4.26,
        'cuda_graph.draft_extend': 0,
        tokenizer_e2e: 766.76,
      },
      rank: null,
    })
    expect(
      parseSglangLine('Engine startup timings (s): load_weight=4.08, cuda_graph={decode=42.70}'),
    ).toMatchObject({
      kind: 'startup_timings',
      totalSeconds: null,
      loadWeightsSeconds: 4.08,
      phases: { load_weight: 4.08, 'cuda_graph.decode': 42.7 },
    })
    expect(parseSglangLine('Engine startup timings (s): scheduler_e2e=2.88')).toMatchObject({
      totalSeconds: 2.88,
      loadWeightsSeconds: null,
    })
  })

  it('never gives a negative part: a rank whose figures sum below 0 counts as 0', () => {
    const acc = new SglangLogAccumulator()
    for (const line of [
      'Load weight begin. avail mem=30.00 GB',
      'Load weight end. elapsed=1.00 s, type=X, avail mem=20.00 GB, mem usage=10.00 GB.',
      'KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, KV size: 5.00 GB',
      'Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1], avail mem=15.00 GB',
      'Capture target decode CUDA graph end. elapsed=1.00 s, mem usage=-0.20 GB, avail mem=15.20 GB.',
      'max_total_num_tokens=1000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=8, context_len=1000, available_gpu_mem=15.20 GB',
    ])
      acc.observe(`[2026-11-24 09:14:22] ${line}`)
    expect(acc.metrics()).toMatchObject({
      cuda_graph_memory_gib: 0,
      weights_memory_gib: 10,
      kv_cache_available_gib: 5,
      total_gpu_memory_gib: 15,
      overhead_memory_gib: 0,
    })
  })
})

const FIXTURES = join(import.meta.dir, '..', 'fixtures', 'sglang')

interface Expected {
  metrics: MemoryMetrics | null
  maxModelLen: number | null
  kvTokens: number | null
  phase: string
  failure: string | null
  /** `Engine startup timings (s)`: the whole start-up and the weights' load, seconds */
  timings?: { total: number | null; loadWeights: number | null }
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
  'sglang-0.5.18.log': {
    'qwen3-8b': {
      // 78.44 free at the load, 8.24 after the graphs: weights + KV + prefill and decode graphs.
      metrics: {
        total_gpu_memory_gib: 70.2,
        weights_memory_gib: 15.38,
        cuda_graph_memory_gib: 0.86,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 53.96,
        kv_cache_per_request_mib: 5760.0693,
        max_model_len: 40960,
      },
      maxModelLen: 40960,
      kvTokens: 392920,
      phase: 'ready',
      failure: null,
      timings: { total: 65.82, loadWeights: 12.02 },
    },
    'llama-3.1-8b-eagle3': {
      // target + draft weights (15.04 + 0.78), both pools (44.32 + 1.38), three graph sets
      // (0.38 + 0.38 − 0.01: the draft-extend capture gave 0.01 back).
      metrics: {
        total_gpu_memory_gib: 62.27,
        weights_memory_gib: 15.82,
        cuda_graph_memory_gib: 0.75,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 45.7,
        kv_cache_per_request_mib: 16892.5437,
        max_model_len: 131072,
      },
      maxModelLen: 131072,
      kvTokens: 363104,
      phase: 'ready',
      failure: null,
      timings: { total: 47.3, loadWeights: 3.51 },
    },
    'qwen3-next-80b-mtp-tp2': {
      // weights 37.70 − 1.86 (the MTP draft's load gave back the target loader's buffers); the cache
      // is the Mamba state (0.28 + 8.07 + 1.20 + 0.05) and both KV pools (14.04 + 1.18); graphs are
      // TP0's (the draft's are logged on rank 0 only), 0.79 + 0.21.
      metrics: {
        total_gpu_memory_gib: 61.66,
        weights_memory_gib: 35.84,
        cuda_graph_memory_gib: 1,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 24.82,
        kv_cache_per_request_mib: 5430.0366,
        max_model_len: 262144,
      },
      maxModelLen: 262144,
      kvTokens: 1226984,
      phase: 'api_server',
      failure: null,
      timings: { total: 78.91, loadWeights: 46.5 },
    },
    'gemma-3-12b-swa': {
      // SWAKVPool's 36.62 stands for its two inner pools (29.30 + 7.32), counted once; the pool's
      // tokens are its full size.
      metrics: {
        total_gpu_memory_gib: 62.23,
        weights_memory_gib: 22.95,
        cuda_graph_memory_gib: 2.66,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 36.62,
        kv_cache_per_request_mib: 40958.7767,
        max_model_len: 131072,
      },
      maxModelLen: 131072,
      kvTokens: 120000,
      phase: 'ready',
      failure: null,
      timings: { total: 52.77, loadWeights: 8.3 },
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
        const timings = acc.startupTimings()
        expect(timings && { total: timings.totalSeconds, loadWeights: timings.loadWeightsSeconds }).toEqual(
          want.timings ?? null,
        )
      })
    }
  }

  it("gives the start-up timings through the engine seam (the driver's logs), null before the line", () => {
    const logs = sglangDriver.logs({})
    const lines = fixtureEngines('sglang-0.5.18.log').get('qwen3-8b') ?? []
    const at = lines.findIndex((l) => l.includes('Engine startup timings'))
    for (const line of lines.slice(0, at)) logs.observe(line)
    expect(logs.startupTimings?.()).toBeNull()
    logs.observe(lines[at]!)
    expect(logs.startupTimings?.()).toMatchObject({ totalSeconds: 65.82, loadWeightsSeconds: 12.02 })
  })
})
