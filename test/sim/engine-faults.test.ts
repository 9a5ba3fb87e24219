import { afterEach, describe, expect, it } from 'bun:test'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { readKvcachedSegment } from '../../src/gpu/kvcached.ts'
import { waitFor } from '../support/wait.ts'
import {
  cleanupSims,
  postJson,
  runSmiCli,
  signalGroup,
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

  it('shares a kvcached segment between engines and removes it on SIGTERM', async () => {
    const dir = tempSimDir()
    const shm = tempSimDir()
    const env = {
      MODELGATE_SIM_DIR: dir,
      MODELGATE_SHM_DIR: shm,
      ENABLE_KVCACHED: 'true',
      KVCACHED_IPC_NAME: 'modelgate_GPU0',
      CUDA_VISIBLE_DEVICES: '0',
    }
    const a = await spawnEngine(MODEL, [], env)
    await waitHealthy(a)
    const b = await spawnEngine(MODEL, [], env)
    await waitHealthy(b)
    const path = join(shm, 'modelgate_GPU0')
    const seg = readKvcachedSegment('modelgate_GPU0', shm)
    expect(seg?.totalBytes).toBe(Math.floor(0.9 * 81559) * 2 ** 20)
    expect(seg?.preallocBytes).toBe(4 * GIB)
    const stream = postJson(a.port, '/v1/completions', {
      prompt: 'a b c',
      max_tokens: 30,
      ignore_eos: true,
      stream: true,
    })
    // The engine publishes its KV use every 250 ms while the stream runs.
    await waitFor('the kvcached segment to count the running stream', () => {
      const used = readKvcachedSegment('modelgate_GPU0', shm)?.usedBytes ?? 0
      return used > 0
    })
    expect(readKvcachedSegment('modelgate_GPU0', shm)?.usedBytes).toBeGreaterThan(0)
    await (await stream).text()
    const used = Number(
      runSmiCli(['--query-gpu=memory.used', '--format=csv,noheader,nounits', '-i', '0'], env).stdout,
    )
    expect(used).toBeLessThan(10 * 1024)
    signalGroup(b.pid, 'SIGTERM')
    expect(await b.exited).toBe(0)
    expect(existsSync(path)).toBe(false)
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
