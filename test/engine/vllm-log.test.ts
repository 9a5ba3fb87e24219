import { describe, expect, it } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { LoadPhase } from '../../src/engine/engine-logs.ts'
import { parseVllmLine, splitVllmLine, stripAnsi, VllmLogAccumulator } from '../../src/engine/vllm-log.ts'

const ESC = '\u001b'
const V1 = '(EngineCore_DP0 pid=441) INFO 10-08 12:34:56 [gpu_model_runner.py:2602] '

describe('stripAnsi', () => {
  it('removes colour codes and leaves plain text alone', () => {
    expect(stripAnsi(`${ESC}[32mINFO${ESC}[0m 10-08 ${ESC}[1;36mhello${ESC}[0m`)).toBe('INFO 10-08 hello')
    expect(stripAnsi('plain (text) [x]')).toBe('plain (text) [x]')
  })
})

describe('splitVllmLine', () => {
  it('separates the process tag, the level prefix and the message', () => {
    expect(splitVllmLine(`${V1}Model loading took 2.05 GiB and 3.1 seconds`)).toEqual({
      worker: 'EngineCore_DP0 pid=441',
      level: 'INFO',
      message: 'Model loading took 2.05 GiB and 3.1 seconds',
    })
  })

  it('accepts every process tag style', () => {
    for (const tag of ['APIServer pid=1', 'EngineCore_0 pid=2', 'EngineCore pid=3', 'Worker_TP1 pid=9']) {
      expect(splitVllmLine(`(${tag}) WARNING 01-02 03:04:05 [x.py:1] hi`).worker).toBe(tag)
    }
    expect(splitVllmLine('(VllmWorker rank=1 pid=77) INFO 01-02 03:04:05 [x.py:1] hi').worker).toBe(
      'VllmWorker rank=1 pid=77',
    )
  })

  it('reads the older prefix without brackets and uvicorn prefixes', () => {
    expect(
      splitVllmLine('INFO 06-18 11:03:19 model_runner.py:160] Loading model weights took 14.96 GB'),
    ).toEqual({
      worker: null,
      level: 'INFO',
      message: 'Loading model weights took 14.96 GB',
    })
    expect(splitVllmLine('(APIServer pid=1) INFO:     Started server process [1]')).toEqual({
      worker: 'APIServer pid=1',
      level: 'INFO',
      message: 'Started server process [1]',
    })
  })

  it('keeps the last carriage-return segment of a progress bar', () => {
    expect(splitVllmLine('Loading shards:  50%|#####\rLoading shards: 100%|##########\r').message).toBe(
      'Loading shards: 100%|##########',
    )
  })

  it('leaves a message that merely starts with a parenthesis untouched', () => {
    expect(splitVllmLine('(this is not a tag) INFO').message).toBe('(this is not a tag) INFO')
  })
})

describe('parseVllmLine', () => {
  it('reads the three weights variants', () => {
    for (const line of [
      'Model loading took 2.0513 GiB and 27.200487 seconds',
      'Model loading took 2.0513 GiB memory and 27.200487 seconds',
    ]) {
      expect(parseVllmLine(V1 + line)).toEqual({
        kind: 'weights',
        gib: 2.0513,
        seconds: 27.200487,
        worker: 'EngineCore_DP0 pid=441',
      })
    }
    expect(parseVllmLine('Model loading took 2.05 GiB memory and 27.2 seconds')).toEqual({
      kind: 'weights',
      gib: 2.05,
      seconds: 27.2,
      worker: null,
    })
    expect(
      parseVllmLine('INFO 06-18 11:03:19 model_runner.py:160] Loading model weights took 14.9595 GB'),
    ).toEqual({ kind: 'weights', gib: 14.9595, seconds: null, worker: null })
  })

  it('does not take the loader timing line for a memory figure', () => {
    expect(parseVllmLine(`${V1}Loading weights took 3.12 seconds`)).toMatchObject({
      kind: 'phase',
      phase: 'loading_weights',
    })
  })

  it('reads KV cache memory, tokens with thousands separators and concurrency', () => {
    expect(parseVllmLine(`${V1}Available KV cache memory: 16.23 GiB`)).toMatchObject({
      kind: 'kv_available',
      gib: 16.23,
    })
    expect(parseVllmLine(`${V1}GPU KV cache size: 425,424 tokens`)).toMatchObject({
      kind: 'kv_tokens',
      tokens: 425_424,
    })
    expect(parseVllmLine(`${V1}GPU KV cache size: 1,018,208 tokens`)).toMatchObject({ tokens: 1_018_208 })
    expect(parseVllmLine(`${V1}Maximum concurrency for 65,536 tokens per request: 6.49x`)).toMatchObject({
      kind: 'concurrency',
      tokensPerRequest: 65_536,
      concurrency: 6.49,
    })
  })

  it("reads kvcached's process-local KV capacity line in place of vLLM's", () => {
    const line =
      '(EngineCore pid=412) [kvcached][WARNING][2026-11-03 09:13:17][patches.py:2128] Using kvcached ' +
      'process-local KV capacity: budget=78226705613 bytes, weights=15299425127 bytes, torch_peak=1547476716 ' +
      'bytes, cudagraph=333718958 bytes (ignored), available=61379803770 bytes; whole-device non-torch and ' +
      'CUDA Graph deltas are ignored'
    expect(splitVllmLine(line)).toMatchObject({ worker: 'EngineCore pid=412', level: 'WARNING' })
    expect(parseVllmLine(line)).toEqual({
      kind: 'kvcached_capacity',
      budgetGib: 72.8543,
      weightsGib: 14.2487,
      availableGib: 57.1644,
      worker: 'EngineCore pid=412',
    })
    const acc = new VllmLogAccumulator()
    acc.feed(
      '(EngineCore pid=412) INFO 11-03 09:13:03 [gpu_model_runner.py:4305] Model loading took 14.25 GiB memory and 4.5 seconds',
    )
    acc.feed(line)
    expect(acc.metrics()).toMatchObject({ kv_cache_available_gib: 57.1644, total_gpu_memory_gib: 72.8543 })
    expect(acc.phase()).toBe('kv_cache')
  })

  it('reads CUDA graph capture, including the occasional negative figure', () => {
    expect(parseVllmLine(`${V1}Graph capturing finished in 7 secs, took 0.95 GiB`)).toMatchObject({
      kind: 'cuda_graphs',
      seconds: 7,
      gib: 0.95,
    })
    expect(parseVllmLine('Graph capturing finished in 21 secs, took -0.54 GiB')).toMatchObject({ gib: -0.54 })
  })

  it('reads the context length from both lines', () => {
    expect(
      parseVllmLine('(APIServer pid=1) INFO 10-08 12:34:50 [model.py:1510] Using max model len 32768'),
    ).toEqual({ kind: 'max_model_len', tokens: 32_768, worker: 'APIServer pid=1' })
    const config =
      "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen2.5-7B-Instruct', " +
      'max_seq_len=32768, download_dir=None, max_seq_len_to_capture=8192, tensor_parallel_size=1'
    expect(
      parseVllmLine(`(EngineCore_DP0 pid=441) INFO 10-08 12:34:51 [core.py:77] ${config}`),
    ).toMatchObject({
      kind: 'max_model_len',
      tokens: 32_768,
    })
  })

  it('reads the V0 budget and breakdown lines', () => {
    expect(
      parseVllmLine(
        'the current vLLM instance can use total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.90) = 71.27GiB',
      ),
    ).toMatchObject({ kind: 'v0_budget', deviceTotalGib: 79.19, utilization: 0.9, budgetGib: 71.27 })
    expect(
      parseVllmLine(
        'model weights take 8.63GiB; non_torch_memory takes 0.09GiB; PyTorch activation peak memory takes ' +
          '1.16GiB; the rest of the memory reserved for KV Cache is 45.21GiB.',
      ),
    ).toMatchObject({
      kind: 'v0_breakdown',
      weightsGib: 8.63,
      nonTorchGib: 0.09,
      activationPeakGib: 1.16,
      kvCacheGib: 45.21,
    })
  })

  it('reads sleep and wake figures', () => {
    expect(
      parseVllmLine(`${V1}Sleep mode freed 70.12 GiB memory, 1.20 GiB memory is still in use.`),
    ).toMatchObject({
      kind: 'sleep_freed',
      freedGib: 70.12,
      stillInUseGib: 1.2,
    })
    expect(parseVllmLine(`${V1}It took 0.812345 seconds to fall asleep.`)).toMatchObject({
      kind: 'sleep_took',
      seconds: 0.812345,
    })
    expect(parseVllmLine(`${V1}It took 0.5 seconds to wake up tags {'weights'}.`)).toMatchObject({
      kind: 'wake_took',
      seconds: 0.5,
    })
  })

  it('reads the free-memory start-up failure with or without the exception name', () => {
    const text =
      'Free memory on device (10.5/79.19 GiB) on startup is less than desired GPU memory utilization ' +
      '(0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.'
    const expected = {
      kind: 'free_memory_error',
      freeGib: 10.5,
      deviceTotalGib: 79.19,
      utilization: 0.9,
      desiredGib: 71.27,
      message: text,
    }
    expect(parseVllmLine(`(EngineCore_DP0 pid=441) ValueError: ${text}`)).toEqual({
      ...expected,
      worker: 'EngineCore_DP0 pid=441',
    } as never)
    expect(parseVllmLine(`ERROR 10-08 12:00:00 [core.py:700] ${text}`)).toMatchObject(expected)
  })

  it('reads the uvicorn start-up lines', () => {
    expect(parseVllmLine('(APIServer pid=1) INFO:     Started server process [1234]')).toMatchObject({
      kind: 'server_started',
      pid: 1234,
    })
    expect(parseVllmLine('INFO:     Waiting for application startup.')).toMatchObject({
      kind: 'app_startup_waiting',
    })
    expect(parseVllmLine(`${ESC}[32mINFO${ESC}[0m:     Application startup complete.`)).toMatchObject({
      kind: 'app_startup_complete',
    })
  })

  it('recognises error lines by level and by exception name', () => {
    const errors = [
      '(EngineCore_DP0 pid=441) ERROR 10-08 12:00:00 [core.py:708] EngineCore failed to start.',
      'CRITICAL 10-08 12:00:00 [launcher.py:99] Engine died',
      '(EngineCore_DP0 pid=441) RuntimeError: NCCL error',
      'ValueError: The model max length is larger than the KV cache',
      'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB',
      'KeyError',
      'WARNING 10-08 12:00:00 [x.py:1] CUDA out of memory while capturing',
      'ERROR:    Exception in ASGI application',
    ]
    for (const line of errors) expect(parseVllmLine(line)?.kind).toBe('error')
    expect(parseVllmLine('torch.OutOfMemoryError: CUDA out of memory.')).toMatchObject({
      message: 'torch.OutOfMemoryError: CUDA out of memory.',
    })
  })

  it('ignores ordinary lines, tracebacks frames and empty lines', () => {
    for (const line of [
      '',
      '   ',
      `${V1}Resolved architecture: Qwen2ForCausalLM`,
      '  File "/usr/lib/python3/site-packages/vllm/engine.py", line 12, in run',
      '    raise ValueError("x")',
      'INFO 10-08 12:00:00 [x.py:1] ValueError handling is enabled',
      '(APIServer pid=1) INFO 10-08 12:34:50 [api_server.py:1896] vLLM API server version 0.11.0',
    ]) {
      expect(parseVllmLine(line)).toBeNull()
    }
  })

  it('matches through ANSI colour codes', () => {
    const line = `(EngineCore_DP0 pid=441) ${ESC}[32mINFO${ESC}[0m 10-08 12:34:56 [gpu_worker.py:298] Available KV cache memory: ${ESC}[1m54.38${ESC}[0m GiB`
    expect(parseVllmLine(line)).toMatchObject({ kind: 'kv_available', gib: 54.38 })
  })
})

/** A v0.11 start-up of Qwen2.5-7B on an 80 GB H100 with gpu_memory_utilization 0.9. */
const SEVEN_B_TRANSCRIPT = `
(APIServer pid=1) INFO 10-08 12:34:40 [api_server.py:1896] vLLM API server version 0.11.0
(APIServer pid=1) INFO 10-08 12:34:40 [utils.py:233] non-default args: {'model': 'Qwen/Qwen2.5-7B-Instruct', 'max_model_len': 32768}
(APIServer pid=1) INFO 10-08 12:34:45 [model.py:547] Resolved architecture: Qwen2ForCausalLM
(APIServer pid=1) INFO 10-08 12:34:45 [model.py:1510] Using max model len 32768
(EngineCore_DP0 pid=441) INFO 10-08 12:34:50 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen2.5-7B-Instruct', max_seq_len=32768, tensor_parallel_size=1
(EngineCore_DP0 pid=441) INFO 10-08 12:34:52 [gpu_model_runner.py:2338] Starting to load model Qwen/Qwen2.5-7B-Instruct...
(EngineCore_DP0 pid=441) Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]
(EngineCore_DP0 pid=441) Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:03<00:00,  1.10it/s]
(EngineCore_DP0 pid=441) INFO 10-08 12:34:56 [default_loader.py:267] Loading weights took 3.64 seconds
(EngineCore_DP0 pid=441) INFO 10-08 12:34:56 [gpu_model_runner.py:2392] Model loading took 14.2487 GiB and 4.218776 seconds
(EngineCore_DP0 pid=441) INFO 10-08 12:35:02 [backends.py:559] Dynamo bytecode transform time: 5.12 s
(EngineCore_DP0 pid=441) INFO 10-08 12:35:12 [monitor.py:34] torch.compile takes 15.53 s in total
(EngineCore_DP0 pid=441) INFO 10-08 12:35:13 [gpu_worker.py:298] Available KV cache memory: 54.38 GiB
(EngineCore_DP0 pid=441) INFO 10-08 12:35:13 [kv_cache_utils.py:1087] GPU KV cache size: 1,018,208 tokens
(EngineCore_DP0 pid=441) INFO 10-08 12:35:13 [kv_cache_utils.py:1091] Maximum concurrency for 32,768 tokens per request: 31.07x
(EngineCore_DP0 pid=441) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:04<00:00, 15.12it/s]
(EngineCore_DP0 pid=441) INFO 10-08 12:35:20 [gpu_model_runner.py:3480] Graph capturing finished in 7 secs, took 0.95 GiB
(EngineCore_DP0 pid=441) INFO 10-08 12:35:20 [core.py:210] init engine (profile, create kv cache, warmup model) took 24.12 seconds
(APIServer pid=1) INFO 10-08 12:35:21 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000
(APIServer pid=1) INFO 10-08 12:35:21 [launcher.py:36] Available routes are:
(APIServer pid=1) INFO:     Started server process [1]
(APIServer pid=1) INFO:     Waiting for application startup.
(APIServer pid=1) INFO:     Application startup complete.
`

/** A v0.11 start-up of a 14B model with tensor_parallel_size 2; each rank logs its own figures. */
const TP2_TRANSCRIPT = `
(APIServer pid=1) INFO 10-08 12:34:45 [model.py:1510] Using max model len 16384
(Worker_TP0 pid=501) INFO 10-08 12:34:52 [gpu_model_runner.py:2338] Starting to load model Qwen/Qwen2.5-14B-Instruct...
(Worker_TP1 pid=502) INFO 10-08 12:34:52 [gpu_model_runner.py:2338] Starting to load model Qwen/Qwen2.5-14B-Instruct...
(Worker_TP0 pid=501) INFO 10-08 12:35:01 [gpu_model_runner.py:2392] Model loading took 13.9 GiB and 8.1 seconds
(Worker_TP1 pid=502) INFO 10-08 12:35:01 [gpu_model_runner.py:2392] Model loading took 13.95 GiB and 8.2 seconds
(Worker_TP1 pid=502) INFO 10-08 12:35:20 [gpu_worker.py:298] Available KV cache memory: 54.1 GiB
(Worker_TP0 pid=501) INFO 10-08 12:35:20 [gpu_worker.py:298] Available KV cache memory: 54.0 GiB
(EngineCore_DP0 pid=440) INFO 10-08 12:35:21 [kv_cache_utils.py:1087] GPU KV cache size: 589,824 tokens
(EngineCore_DP0 pid=440) INFO 10-08 12:35:21 [kv_cache_utils.py:1091] Maximum concurrency for 16,384 tokens per request: 36.00x
(Worker_TP0 pid=501) INFO 10-08 12:35:30 [gpu_model_runner.py:3480] Graph capturing finished in 9 secs, took 1.10 GiB
(Worker_TP1 pid=502) INFO 10-08 12:35:30 [gpu_model_runner.py:3480] Graph capturing finished in 9 secs, took 1.25 GiB
(APIServer pid=1) INFO:     Started server process [1]
(APIServer pid=1) INFO:     Waiting for application startup.
(APIServer pid=1) INFO:     Application startup complete.
`

const feedAll = (acc: VllmLogAccumulator, transcript: string): void => {
  for (const line of transcript.split('\n')) acc.feed(line)
}

describe('VllmLogAccumulator', () => {
  it('turns a 7B start-up transcript into per-GPU memory metrics', () => {
    const acc = new VllmLogAccumulator({ gpuMemoryUtilization: 0.9, deviceTotalGib: 79.19 })
    feedAll(acc, SEVEN_B_TRANSCRIPT)
    const m = acc.metrics()!
    expect(m.total_gpu_memory_gib).toBeCloseTo(71.271, 3)
    expect(m.weights_memory_gib).toBe(14.2487)
    expect(m.cuda_graph_memory_gib).toBe(0.95)
    expect(m.kv_cache_available_gib).toBe(54.38)
    expect(m.overhead_memory_gib).toBeCloseTo(71.271 - 14.2487 - 0.95 - 54.38, 3)
    expect(m.kv_cache_per_request_mib).toBeCloseTo((54.38 * 1024) / 31.07, 3)
    expect(m.max_model_len).toBe(32_768)
    expect(acc.phase()).toBe('ready')
    expect(acc.progressPercent()).toBe(100)
    expect(acc.serverPid()).toBe(1)
    expect(acc.kvCacheTokens()).toBe(1_018_208)
    expect(acc.startupFailure()).toBeNull()
  })

  it('keeps per-GPU figures for a TP=2 engine and lists each rank', () => {
    const acc = new VllmLogAccumulator()
    feedAll(acc, TP2_TRANSCRIPT)
    const m = acc.metrics()!
    expect(m.weights_memory_gib).toBe(13.95)
    expect(m.kv_cache_available_gib).toBe(54)
    expect(m.cuda_graph_memory_gib).toBe(1.25)
    expect(m.total_gpu_memory_gib).toBe(69.2)
    expect(m.overhead_memory_gib).toBe(0)
    expect(m.kv_cache_per_request_mib).toBeCloseTo((54 * 1024) / 36, 4)
    expect(m.max_model_len).toBe(16_384)
    expect(acc.workers()).toEqual([
      { worker: 'Worker_TP0 pid=501', weightsGib: 13.9, kvCacheAvailableGib: 54, cudaGraphGib: 1.1 },
      { worker: 'Worker_TP1 pid=502', weightsGib: 13.95, kvCacheAvailableGib: 54.1, cudaGraphGib: 1.25 },
    ])
  })

  it('walks the phases forward and never back', () => {
    const acc = new VllmLogAccumulator()
    const seen: [string, number][] = []
    for (const line of SEVEN_B_TRANSCRIPT.split('\n')) {
      acc.feed(line)
      const last = seen.at(-1)
      if (last?.[0] !== acc.phase()) seen.push([acc.phase(), acc.progressPercent()])
    }
    expect(seen).toEqual([
      ['starting', 5],
      ['loading_weights', 30],
      ['profiling', 55],
      ['kv_cache', 70],
      ['cuda_graphs', 85],
      ['api_server', 95],
      ['ready', 100],
    ])
    acc.feed(`${V1}Starting to load model x`)
    expect(acc.phase()).toBe('ready')
  })

  it('returns null metrics until weights and KV cache are both known', () => {
    const acc = new VllmLogAccumulator()
    expect(acc.metrics()).toBeNull()
    acc.feed(`${V1}Model loading took 2.0513 GiB and 27.200487 seconds`)
    expect(acc.metrics()).toBeNull()
    acc.feed(`${V1}Available KV cache memory: 16.23 GiB`)
    expect(acc.metrics()).toMatchObject({
      weights_memory_gib: 2.0513,
      kv_cache_available_gib: 16.23,
      cuda_graph_memory_gib: 0,
      total_gpu_memory_gib: 18.2813,
      overhead_memory_gib: 0,
      kv_cache_per_request_mib: 0,
      max_model_len: 0,
    })
  })

  it('derives KV per request from tokens and context length without a concurrency line', () => {
    const acc = new VllmLogAccumulator()
    acc.feed('Model loading took 2 GiB and 1 seconds')
    acc.feed('Available KV cache memory: 16 GiB')
    acc.feed('GPU KV cache size: 131,072 tokens')
    acc.feed('Using max model len 8192')
    expect(acc.metrics()?.kv_cache_per_request_mib).toBe(1024)
  })

  it('reads a V0 engine from its budget and breakdown lines', () => {
    const acc = new VllmLogAccumulator()
    for (const line of [
      'INFO 01-10 10:00:00 model_runner.py:1072] Model loading took 8.63 GiB and 4.5 seconds',
      'INFO 01-10 10:00:10 worker.py:232] Memory profiling takes 3.21 seconds',
      'the current vLLM instance can use total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.90) = 71.27GiB',
      'model weights take 8.63GiB; non_torch_memory takes 0.09GiB; PyTorch activation peak memory takes 1.16GiB; the rest of the memory reserved for KV Cache is 45.21GiB.',
      'INFO 01-10 10:00:11 executor_base.py:110] # CUDA blocks: 2929, # CPU blocks: 512',
      'INFO 01-10 10:00:11 executor_base.py:115] Maximum concurrency for 32768 tokens per request: 5.72x',
      'INFO 01-10 10:00:30 model_runner.py:1562] Graph capturing finished in 18 secs, took 0.85 GiB',
    ]) {
      acc.feed(line)
    }
    expect(acc.metrics()).toEqual({
      total_gpu_memory_gib: 71.27,
      weights_memory_gib: 8.63,
      cuda_graph_memory_gib: 0.85,
      overhead_memory_gib: 16.58,
      kv_cache_available_gib: 45.21,
      kv_cache_per_request_mib: Math.round(((45.21 * 1024) / 5.72) * 10_000) / 10_000,
      max_model_len: 32_768,
    })
    expect(acc.phase()).toBe('cuda_graphs')
  })

  it('takes KV cache from the V0 breakdown when no V1 line exists', () => {
    const acc = new VllmLogAccumulator()
    acc.feed(
      'model weights take 8.63GiB; non_torch_memory takes 0.09GiB; PyTorch activation peak memory takes 1.16GiB; the rest of the memory reserved for KV Cache is 45.21GiB.',
    )
    expect(acc.metrics()).toMatchObject({ weights_memory_gib: 8.63, kv_cache_available_gib: 45.21 })
  })

  it('raises the total to the sum of the parts when they exceed the budget', () => {
    const acc = new VllmLogAccumulator({ gpuMemoryUtilization: 0.5, deviceTotalGib: 40 })
    acc.feed('Model loading took 10 GiB and 1 seconds')
    acc.feed('Available KV cache memory: 9 GiB')
    acc.feed('Graph capturing finished in 3 secs, took 2 GiB')
    expect(acc.metrics()).toMatchObject({ total_gpu_memory_gib: 21, overhead_memory_gib: 0 })
  })

  it('surfaces the free-memory refusal as the start-up failure', () => {
    const acc = new VllmLogAccumulator()
    for (const line of [
      '(EngineCore_DP0 pid=441) ERROR 10-08 12:00:00 [core.py:708] EngineCore failed to start.',
      '(EngineCore_DP0 pid=441) Traceback (most recent call last):',
      '(EngineCore_DP0 pid=441)   File "/vllm/v1/worker/gpu_worker.py", line 200, in init_device',
      '(EngineCore_DP0 pid=441) ValueError: Free memory on device (10.5/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.',
      "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}",
    ]) {
      acc.feed(line)
    }
    expect(acc.startupFailure()).toStartWith('Free memory on device (10.5/79.19 GiB) on startup is less than')
    const [freeMemory, wrapper] = acc.lastErrorLines(2)
    expect(freeMemory).toStartWith('Free memory on device')
    expect(wrapper).toStartWith('RuntimeError: Engine core initialization failed')
  })

  it('prefers a root-cause error line over generic wrappers', () => {
    const acc = new VllmLogAccumulator()
    acc.feed('(EngineCore_DP0 pid=441) ERROR 10-08 12:00:00 [core.py:708] EngineCore failed to start.')
    expect(acc.startupFailure()).toBe('EngineCore failed to start.')
    acc.feed(
      '(EngineCore_DP0 pid=441) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.',
    )
    acc.feed('(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.')
    expect(acc.startupFailure()).toBe(
      'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.',
    )
    expect(acc.lastErrorLines(0)).toEqual([])
    expect(acc.lastErrorLines(10)).toHaveLength(3)
  })

  it('records sleep and wake figures', () => {
    const acc = new VllmLogAccumulator()
    expect(acc.lastSleep()).toBeNull()
    acc.feed(`${V1}Sleep mode freed 70.12 GiB memory, 1.20 GiB memory is still in use.`)
    acc.feed(`${V1}It took 0.812345 seconds to fall asleep.`)
    acc.feed(`${V1}It took 1.5 seconds to wake up tags None.`)
    expect(acc.lastSleep()).toEqual({ freedGib: 70.12, stillInUseGib: 1.2, seconds: 0.812345 })
    expect(acc.lastWakeSeconds()).toBe(1.5)
  })

  it('returns the fact each line carried', () => {
    const acc = new VllmLogAccumulator()
    expect(acc.feed('hello')).toBeNull()
    expect(acc.feed('Using max model len 4,096')).toMatchObject({ kind: 'max_model_len', tokens: 4096 })
    expect(acc.maxModelLen()).toBe(4096)
  })
})

/**
 * The table of real lines per vLLM release (test/fixtures/vllm/<version>.log, sources in its README):
 * each `### engine: NAME` section is one engine's output, fed to its own accumulator; what it must
 * yield is below. Every fixture file must be listed, and every engine in it.
 */
const FIXTURES = join(import.meta.dir, '..', 'fixtures', 'vllm')

interface Expected {
  metrics: ReturnType<VllmLogAccumulator['metrics']>
  maxModelLen: number | null
  kvTokens: number | null
  concurrency: number | null
  phase: string
  failure?: ReturnType<VllmLogAccumulator['freeMemoryFailure']>
  startup?: ReturnType<VllmLogAccumulator['startupMemory']>
  sleep?: ReturnType<VllmLogAccumulator['lastSleep']>
  wake?: number
  workers?: number
}

const REFUSAL_TAIL =
  'on startup is less than desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.'

const EXPECTED: Record<string, Record<string, Expected>> = {
  '0.8.5.log': {
    'qwen2.5-7b-v0': {
      metrics: {
        total_gpu_memory_gib: 71.27,
        weights_memory_gib: 14.2487,
        cuda_graph_memory_gib: 0.85,
        overhead_memory_gib: 0.7013,
        kv_cache_available_gib: 55.47,
        kv_cache_per_request_mib: 1791.8385,
        max_model_len: 32768,
      },
      maxModelLen: 32768,
      kvTokens: null,
      concurrency: 31.7,
      phase: 'ready',
      sleep: { freedGib: 69.98, stillInUseGib: 1.12, seconds: 0.912044 },
      wake: 0.357211,
    },
  },
  '0.9.1.log': {
    'qwen2.5-7b': {
      metrics: {
        total_gpu_memory_gib: 69.1387,
        weights_memory_gib: 14.2487,
        cuda_graph_memory_gib: 0.51,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 54.38,
        kv_cache_per_request_mib: 1792.2472,
        max_model_len: 32768,
      },
      maxModelLen: 32768,
      kvTokens: 1_018_240,
      concurrency: 31.07,
      phase: 'ready',
    },
    'tp2-refused': {
      metrics: null,
      maxModelLen: 32768,
      kvTokens: null,
      concurrency: null,
      phase: 'starting',
      failure: {
        device: null,
        freeGib: 9.6,
        deviceTotalGib: 47.38,
        utilization: 0.9,
        desiredGib: 42.64,
        message:
          'Free memory on device (9.6/47.38 GiB) on startup is less than desired GPU memory utilization (0.9, 42.64 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.',
      },
    },
  },
  '0.10.2.log': {
    'qwen2.5-14b-tp2': {
      metrics: {
        total_gpu_memory_gib: 71.27,
        weights_memory_gib: 13.9281,
        cuda_graph_memory_gib: 1.13,
        overhead_memory_gib: 1.7919,
        kv_cache_available_gib: 54.42,
        kv_cache_per_request_mib: 3072,
        max_model_len: 32768,
      },
      maxModelLen: 32768,
      kvTokens: 594_400,
      concurrency: 18.14,
      phase: 'ready',
      startup: { freeGib: 78.66, deviceTotalGib: 79.19, utilization: 0.9, desiredGib: 71.27 },
      sleep: { freedGib: 69.54, stillInUseGib: 1.64, seconds: 1.204873 },
      wake: 0.68823,
      workers: 2,
    },
  },
  '0.11.2.log': {
    // No start-up summary (DEBUG in 0.11–0.20): without the launch's utilization hint the total is the
    // sum of the parts.
    'qwen2.5-7b-16k': {
      metrics: {
        total_gpu_memory_gib: 69.8887,
        weights_memory_gib: 14.2487,
        cuda_graph_memory_gib: 0.49,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 55.15,
        kv_cache_per_request_mib: 895.9797,
        max_model_len: 16384,
      },
      maxModelLen: 16384,
      kvTokens: 1_032_656,
      concurrency: 63.03,
      phase: 'ready',
      sleep: { freedGib: 70.41, stillInUseGib: 0.78, seconds: 0.061502 },
      wake: 0.018215,
    },
  },
  '0.15.0.log': {
    'qwen3-30b-a3b-tp4': {
      metrics: {
        total_gpu_memory_gib: 20.37,
        weights_memory_gib: 14.27,
        cuda_graph_memory_gib: 0.62,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 5.48,
        kv_cache_per_request_mib: 959.2342,
        max_model_len: 40960,
      },
      maxModelLen: 40960,
      kvTokens: 239_424,
      concurrency: 5.85,
      phase: 'ready',
      // vllm#32714: the sleep freed only the KV cache, the weights stayed on each GPU.
      sleep: { freedGib: 5.91, stillInUseGib: 16.04, seconds: 0.402779 },
      workers: 4,
    },
    'refused-on-busy-gpu': {
      metrics: null,
      maxModelLen: null,
      kvTokens: null,
      concurrency: null,
      phase: 'starting',
      failure: {
        device: 'cuda:0',
        freeGib: 2.91,
        deviceTotalGib: 22.05,
        utilization: 0.9,
        desiredGib: 19.84,
        message: `Free memory on device cuda:0 (2.91/22.05 GiB) ${REFUSAL_TAIL}`,
      },
    },
    'refused-in-colour': {
      metrics: null,
      maxModelLen: null,
      kvTokens: null,
      concurrency: null,
      phase: 'starting',
      failure: {
        device: 'cuda:0',
        freeGib: 1.54,
        deviceTotalGib: 22.05,
        utilization: 0.9,
        desiredGib: 19.84,
        message: `Free memory on device cuda:0 (1.54/22.05 GiB) ${REFUSAL_TAIL}`,
      },
    },
    'refused-second-rank': {
      metrics: null,
      maxModelLen: null,
      kvTokens: null,
      concurrency: null,
      phase: 'starting',
      failure: {
        device: 'cuda:1',
        freeGib: 19.77,
        deviceTotalGib: 22.05,
        utilization: 0.9,
        desiredGib: 19.84,
        message: `Free memory on device cuda:1 (19.77/22.05 GiB) ${REFUSAL_TAIL}`,
      },
    },
  },
  // kvcached main (f8bbb00 and later) replaces vLLM's memory probe: no `Available KV cache memory`
  // line, kvcached's process-local capacity line instead (budget = utilization × device).
  '0.20.2-kvcached.log': {
    'qwen2.5-7b-shared': {
      metrics: {
        total_gpu_memory_gib: 72.8543,
        weights_memory_gib: 14.25,
        cuda_graph_memory_gib: 0.31,
        overhead_memory_gib: 1.1299,
        kv_cache_available_gib: 57.1644,
        kv_cache_per_request_mib: 1791.7461,
        max_model_len: 32768,
      },
      maxModelLen: 32768,
      kvTokens: 1_070_368,
      concurrency: 32.67,
      phase: 'ready',
      // kvcached maps its KV pages outside vLLM's sleep allocator: a level-1 sleep frees the weights.
      sleep: { freedGib: 14.25, stillInUseGib: 9.87, seconds: 0.688415 },
    },
    'qwen2.5-1.5b-second-on-the-gpu': {
      metrics: {
        total_gpu_memory_gib: 72.8543,
        weights_memory_gib: 2.89,
        cuda_graph_memory_gib: 0.18,
        overhead_memory_gib: 0.4196,
        kv_cache_available_gib: 69.3647,
        kv_cache_per_request_mib: 896.0446,
        max_model_len: 32768,
      },
      maxModelLen: 32768,
      kvTokens: 2_597_648,
      concurrency: 79.27,
      phase: 'ready',
    },
  },
  '0.29.0.log': {
    'qwen2.5-7b': {
      metrics: {
        total_gpu_memory_gib: 71.33,
        weights_memory_gib: 14.25,
        cuda_graph_memory_gib: 0.23,
        overhead_memory_gib: 2.34,
        kv_cache_available_gib: 54.51,
        kv_cache_per_request_mib: 1791.9178,
        max_model_len: 32768,
      },
      maxModelLen: 32768,
      kvTokens: 1_020_672,
      concurrency: 31.15,
      phase: 'ready',
      startup: { freeGib: 78.84, deviceTotalGib: 79.25, utilization: 0.9, desiredGib: 71.33 },
      sleep: { freedGib: 69.4, stillInUseGib: 1.32, seconds: 0.744127 },
      wake: 0.513377,
    },
    // A log read from the middle (no `Using max model len`, no engine-config line): the context
    // length and the KV per request come from the merged KV line alone.
    'llama-3.1-8b-fp8-tail': {
      metrics: {
        total_gpu_memory_gib: 21.28,
        weights_memory_gib: 8.49,
        cuda_graph_memory_gib: 0,
        overhead_memory_gib: 0,
        kv_cache_available_gib: 12.79,
        kv_cache_per_request_mib: 512,
        max_model_len: 4096,
      },
      maxModelLen: 4096,
      kvTokens: 104_768,
      concurrency: 25.58,
      phase: 'kv_cache',
    },
  },
}

function fixtureEngines(file: string): Map<string, string[]> {
  const engines = new Map<string, string[]>()
  let current: string[] | undefined
  for (const line of readFileSync(join(FIXTURES, file), 'utf8').split('\n')) {
    const header = /^### engine: (.+)$/.exec(line)
    if (header) {
      current = []
      engines.set(header[1] ?? '', current)
    } else if (line !== '') current?.push(line)
  }
  return engines
}

describe('real vLLM lines per version (test/fixtures/vllm)', () => {
  it('has an expectation for every fixture file and every engine in it', () => {
    const files = readdirSync(FIXTURES).filter((f) => f.endsWith('.log'))
    expect(files.sort()).toEqual(Object.keys(EXPECTED).sort())
    for (const file of files)
      expect([...fixtureEngines(file).keys()]).toEqual(Object.keys(EXPECTED[file] ?? {}))
  })

  for (const [file, engines] of Object.entries(EXPECTED)) {
    for (const [engine, want] of Object.entries(engines)) {
      it(`${file} ${engine}`, () => {
        const acc = new VllmLogAccumulator()
        const lines = fixtureEngines(file).get(engine) ?? []
        expect(lines.length).toBeGreaterThan(0)
        for (const line of lines) acc.feed(line)
        expect(acc.metrics()).toEqual(want.metrics)
        expect(acc.maxModelLen()).toBe(want.maxModelLen)
        expect(acc.kvCacheTokens()).toBe(want.kvTokens)
        expect(acc.maxConcurrency()).toBe(want.concurrency)
        expect(acc.phase()).toBe(want.phase as LoadPhase)
        expect(acc.freeMemoryFailure()).toEqual(want.failure ?? null)
        expect(acc.startupFailure()).toBe(want.failure?.message ?? null)
        expect(acc.startupMemory()).toEqual(want.startup ?? null)
        expect(acc.lastSleep()).toEqual(want.sleep ?? null)
        expect(acc.lastWakeSeconds()).toBe(want.wake ?? null)
        if (want.workers !== undefined) expect(acc.workers()).toHaveLength(want.workers)
      })
    }
  }
})
