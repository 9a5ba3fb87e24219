import { afterEach, describe, expect, it } from 'bun:test'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { VllmLogAccumulator } from '../../src/engine/vllm-log.ts'
import { readKvcachedSegment } from '../../src/gpu/kvcached.ts'
import { waitFor } from '../support/wait.ts'
import {
  cleanupSims,
  openStream,
  postJson,
  runSmiCli,
  signalGroup,
  smiUsedMib,
  spawnEngine,
  sseFrames,
  tempSimDir,
  waitHealthy,
} from './helpers.ts'

afterEach(cleanupSims)

const MODEL = 'Qwen/Qwen2.5-0.5B-Instruct'
const GIB = 2 ** 30

describe('sim engine faults', () => {
  it('dies mid-stream after SIM_CRASH_AFTER_TOKENS with a traceback and exit 1', async () => {
    const dir = tempSimDir()
    const e = await spawnEngine(MODEL, [], {
      MODELGATE_SIM_DIR: dir,
      SIM_CRASH_AFTER_TOKENS: '5',
      SIM_TOKENS_PER_SEC: '200',
    })
    await waitHealthy(e)
    const res = await postJson(e.port, '/v1/completions', {
      prompt: 'x',
      max_tokens: 50,
      ignore_eos: true,
      stream: true,
    })
    const body = await res.text().catch(() => '')
    expect(sseFrames(body).filter((f) => f.startsWith('{')).length).toBeLessThanOrEqual(5)
    expect(body).not.toContain('[DONE]')
    expect(await e.exited).toBe(1)
    expect(e.stderr()).toContain('RuntimeError: CUDA error: an illegal memory access was encountered')
    const apps = runSmiCli(['--query-compute-apps=pid', '--format=csv,noheader,nounits'], {
      MODELGATE_SIM_DIR: dir,
    })
    expect(apps.stdout).toBe('')
  })

  it('sends one error chunk then [DONE] when the crash mode is error', async () => {
    const e = await spawnEngine(MODEL, [], {
      MODELGATE_SIM_DIR: tempSimDir(),
      SIM_CRASH_AFTER_TOKENS: '3',
      SIM_CRASH_MODE: 'error',
      SIM_ERROR_SHAPE: 'old',
    })
    await waitHealthy(e)
    const res = await postJson(e.port, '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 50,
      ignore_eos: true,
      stream: true,
    })
    const frames = sseFrames(await res.text())
    expect(frames.at(-1)).toBe('[DONE]')
    const error = JSON.parse(frames.at(-2) ?? '{}')
    expect(error).toMatchObject({ object: 'error', type: 'InternalServerError', code: 500 })
    expect(await e.exited).toBe(1)
  })

  it('gives each kvcached engine its own segment, and removes only its own on SIGTERM', async () => {
    const dir = tempSimDir()
    const shm = tempSimDir()
    const env = {
      MODELGATE_SIM_DIR: dir,
      MODELGATE_SHM_DIR: shm,
      ENABLE_KVCACHED: 'true',
      CUDA_VISIBLE_DEVICES: '0',
    }
    const a = await spawnEngine(MODEL, [], { ...env, KVCACHED_IPC_NAME: 'engine_a' })
    await waitHealthy(a)
    const b = await spawnEngine(MODEL, [], { ...env, KVCACHED_IPC_NAME: 'engine_b' })
    await waitHealthy(b)
    const budget = Math.floor(0.9 * 81559) * 2 ** 20
    for (const name of ['engine_a', 'engine_b'])
      expect(readKvcachedSegment(name, shm)).toEqual({
        totalBytes: budget,
        usedBytes: 0,
        preallocBytes: 2 * GIB,
      })
    const stream = postJson(a.port, '/v1/completions', {
      prompt: 'a b c',
      max_tokens: 30,
      ignore_eos: true,
      stream: true,
    })
    // The engine publishes its KV use every 250 ms while the stream runs, in its own segment only.
    await waitFor(
      'engine a to count the running stream',
      () => (readKvcachedSegment('engine_a', shm)?.usedBytes ?? 0) > 0,
    )
    expect(readKvcachedSegment('engine_b', shm)?.usedBytes).toBe(0)
    await (await stream).text()
    const used = Number(
      runSmiCli(['--query-gpu=memory.used', '--format=csv,noheader,nounits', '-i', '0'], env).stdout,
    )
    expect(used).toBeLessThan(10 * 1024)
    signalGroup(b.pid, 'SIGTERM')
    expect(await b.exited).toBe(0)
    expect(existsSync(join(shm, 'engine_b'))).toBe(false)
    expect(existsSync(join(shm, 'engine_a'))).toBe(true)
  })

  it("prints kvcached's process-local KV capacity instead of vLLM's Available KV cache memory", async () => {
    const e = await spawnEngine(MODEL, ['--max-model-len', '4096'], {
      MODELGATE_SIM_DIR: tempSimDir(),
      MODELGATE_SHM_DIR: tempSimDir(),
      ENABLE_KVCACHED: 'true',
      CUDA_VISIBLE_DEVICES: '0',
    })
    await waitHealthy(e)
    expect(e.stdout()).not.toContain('Available KV cache memory')
    const line = e
      .stderr()
      .split('\n')
      .find((l) => l.includes('Using kvcached process-local KV capacity'))
    expect(line).toMatch(
      /^\(EngineCore pid=\d+\) \[kvcached\]\[WARNING\]\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]\[patches\.py:2128\] Using kvcached process-local KV capacity: budget=(\d+) bytes, weights=(\d+) bytes, torch_peak=(\d+) bytes, cudagraph=\d+ bytes \(ignored\), available=(\d+) bytes; whole-device non-torch and CUDA Graph deltas are ignored$/,
    )
    const [budget, weights, peak, available] =
      /budget=(\d+).*weights=(\d+).*torch_peak=(\d+).*available=(\d+)/
        .exec(line ?? '')!
        .slice(1)
        .map(Number) as [number, number, number, number]
    expect(available).toBe(budget - weights - peak)
    expect(budget).toBe(Math.floor(0.9 * 81559) * 2 ** 20)
    // What the gateway reads from this output: the KV cache is kvcached's capacity, in tokens too.
    const acc = new VllmLogAccumulator()
    for (const l of `${e.stdout()}\n${e.stderr()}`.split('\n')) acc.feed(l)
    const m = acc.metrics()
    expect(m?.kv_cache_available_gib).toBeCloseTo(available / GIB, 3)
    expect(m?.total_gpu_memory_gib).toBeGreaterThanOrEqual(Math.floor((budget / GIB) * 1e4) / 1e4)
    const perToken = (2 * 24 * 2 * 64 * 2) / GIB // Qwen2.5-0.5B: 24 layers, 2 KV heads of 64, bf16
    expect(acc.kvCacheTokens()! * perToken).toBeCloseTo(available / GIB, 0)
  })

  it("starts a kvcached engine on a GPU vLLM's own guard would refuse, with kvcached's warning", async () => {
    const dir = tempSimDir()
    const first = await spawnEngine(MODEL, ['--gpu-memory-utilization', '0.5'], {
      MODELGATE_SIM_DIR: dir,
      CUDA_VISIBLE_DEVICES: '0',
    })
    await waitHealthy(first)
    const shared = await spawnEngine(MODEL, [], {
      MODELGATE_SIM_DIR: dir,
      MODELGATE_SHM_DIR: tempSimDir(),
      ENABLE_KVCACHED: 'true',
      CUDA_VISIBLE_DEVICES: '0',
    })
    await waitHealthy(shared)
    expect(shared.stderr()).toMatch(
      /\[kvcached\]\[WARNING\]\[[^\]]+\]\[patches\.py:\d+\] Ignoring vLLM's whole-device startup memory guard because kvcached provides virtual KV capacity: free=\d+ bytes, requested=\d+ bytes/,
    )
    expect(shared.stdout()).not.toContain('is less than desired GPU memory utilization')
  })
})

describe('sim engine core death', () => {
  const child = (out: string, tag: string) => Number(new RegExp(`\\(${tag} pid=(\\d+)\\)`).exec(out)?.[1])

  it('answers /health 503 once the EngineCore child is killed, fails the streams, then exits on the next request', async () => {
    const dir = tempSimDir()
    const e = await spawnEngine(MODEL, ['--gpu-memory-utilization', '0.3'], {
      MODELGATE_SIM_DIR: dir,
      CUDA_VISIBLE_DEVICES: '0',
      SIM_TOKENS_PER_SEC: '50',
    })
    await waitHealthy(e)
    expect(smiUsedMib(dir, 0)).toBe(4 + Math.floor(0.3 * 81559))
    const stream = await openStream(e.port, '/v1/completions', {
      prompt: 'a',
      max_tokens: 200,
      ignore_eos: true,
    })
    await stream.waitTokens(2)
    process.kill(child(e.stdout(), 'EngineCore'), 'SIGKILL')
    const frames = await stream.done
    expect(frames.at(-1)).toBe('[DONE]')
    expect(JSON.parse(frames.at(-2) ?? '{}').error.message).toBe(
      'EngineCore encountered an issue. See stack trace (above) for the root cause.',
    )
    await e.waitForOutput('Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.')
    const base = `http://127.0.0.1:${e.port}`
    expect((await fetch(`${base}/health`)).status).toBe(503)
    expect((await fetch(`${base}/v1/models`)).status).toBe(200)
    expect(smiUsedMib(dir, 0)).toBe(4)
    const res = await postJson(e.port, '/v1/completions', { prompt: 'a', max_tokens: 2 })
    expect(res.status).toBe(500)
    expect(await e.exited).toBe(0)
  })

  it('dies the same when a TP worker is killed, and stays up with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH', async () => {
    const dir = tempSimDir()
    const e = await spawnEngine(MODEL, ['-tp', '2', '--gpu-memory-utilization', '0.3'], {
      MODELGATE_SIM_DIR: dir,
      VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: '1',
    })
    await waitHealthy(e)
    process.kill(child(e.stdout(), 'Worker_TP1'), 'SIGKILL')
    await e.waitForOutput('Worker proc VllmWorker-1 died unexpectedly, shutting down executor.')
    const base = `http://127.0.0.1:${e.port}`
    await waitFor('/health to answer 503', async () => (await fetch(`${base}/health`)).status === 503)
    expect(smiUsedMib(dir, 0)).toBe(4)
    expect(smiUsedMib(dir, 1)).toBe(4)
    expect((await postJson(e.port, '/v1/completions', { prompt: 'a', max_tokens: 2 })).status).toBe(500)
    await Bun.sleep(100) // an absence: a server that exits does so 20 ms after that answer
    expect(e.proc.exitCode).toBeNull()
    expect((await fetch(`${base}/health`)).status).toBe(503)
  })
})

describe('sim engine timing knobs', () => {
  it('delays the first token by SIM_TTFT_MS', async () => {
    const e = await spawnEngine(MODEL, [], {
      MODELGATE_SIM_DIR: tempSimDir(),
      SIM_TTFT_MS: '300',
      SIM_TOKENS_PER_SEC: '1000',
    })
    await waitHealthy(e)
    const t0 = performance.now()
    const res = await postJson(e.port, '/v1/completions', { prompt: 'x', max_tokens: 2, ignore_eos: true })
    expect((await res.json()).usage.completion_tokens).toBe(2)
    expect(performance.now() - t0).toBeGreaterThanOrEqual(290)
    const metrics = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text()
    expect(metrics).toMatch(/vllm:time_to_first_token_seconds_bucket\{[^}]*le="0\.25"\} 0\.0/)
    expect(metrics).toMatch(/vllm:time_to_first_token_seconds_bucket\{[^}]*le="0\.5"\} 1\.0/)
  })
})
