import { afterEach, describe, expect, it } from 'bun:test'
import { waitFor } from '../support/wait.ts'
import { cleanupSims, postJson, runSmiCli, spawnEngine, tempSimDir, waitHealthy } from './helpers.ts'

afterEach(cleanupSims)

const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
const BUDGET = Math.floor(0.5 * 81559)
const WEIGHTS = Math.round(((7.62e9 * 2) / 2 ** 30) * 1024)

function usedOnGpu0(dir: string): number {
  const res = runSmiCli(['--query-gpu=memory.used', '--format=csv,noheader,nounits', '-i', '0'], {
    MODELGATE_SIM_DIR: dir,
  })
  return Number(res.stdout.trim()) - 4
}

async function sleepEngine(dir: string, env: Record<string, string> = {}) {
  const e = await spawnEngine(MODEL, ['--enable-sleep-mode', '--gpu-memory-utilization', '0.5'], {
    MODELGATE_SIM_DIR: dir,
    CUDA_VISIBLE_DEVICES: '0',
    VLLM_SERVER_DEV_MODE: '1',
    SIM_WAKE_DELAY_MS: '150',
    ...env,
  })
  await waitHealthy(e)
  return e
}

describe('sim engine sleep mode', () => {
  it('frees memory at level 1, wakes weights and KV cache separately, and reports is_sleeping', async () => {
    const dir = tempSimDir()
    const e = await sleepEngine(dir)
    const base = `http://127.0.0.1:${e.port}`
    expect(usedOnGpu0(dir)).toBe(BUDGET)
    expect(await (await fetch(`${base}/is_sleeping`)).json()).toEqual({ is_sleeping: false })

    const slept = await fetch(`${base}/sleep?level=1`, { method: 'POST' })
    expect(slept.status).toBe(200)
    expect(await slept.text()).toBe('')
    const residual = Math.round(BUDGET * 0.1)
    expect(usedOnGpu0(dir)).toBe(residual)
    expect(await (await fetch(`${base}/is_sleeping`)).json()).toEqual({ is_sleeping: true })
    expect((await fetch(`${base}/health`)).status).toBe(200)
    await e.waitForOutput(/Sleep mode freed [\d.]+ GiB memory, [\d.]+ GiB memory is still in use\./)
    await e.waitForOutput(/It took \d+\.\d{6} seconds to fall asleep\./)

    expect((await fetch(`${base}/wake_up?tags=weights`, { method: 'POST' })).status).toBe(200)
    expect(usedOnGpu0(dir)).toBe(residual + WEIGHTS)
    expect(await (await fetch(`${base}/is_sleeping`)).json()).toEqual({ is_sleeping: true })
    expect((await fetch(`${base}/wake_up?tags=kv_cache`, { method: 'POST' })).status).toBe(200)
    expect(usedOnGpu0(dir)).toBe(BUDGET)
    expect(await (await fetch(`${base}/is_sleeping`)).json()).toEqual({ is_sleeping: false })
  })

  it('keeps 5% at level 2, queues inference until woken, and takes longer to wake', async () => {
    const dir = tempSimDir()
    const e = await sleepEngine(dir)
    const base = `http://127.0.0.1:${e.port}`
    await fetch(`${base}/sleep?level=2`, { method: 'POST' })
    expect(usedOnGpu0(dir)).toBe(Math.round(BUDGET * 0.05))
    let answered = false
    const pending = postJson(e.port, '/v1/completions', {
      prompt: 'hi',
      max_tokens: 2,
      ignore_eos: true,
    }).then((r) => {
      answered = true
      return r
    })
    // Queued, not answered: wait until the engine counts it waiting.
    const metrics = await waitFor('the request to be queued while asleep', async () => {
      const text = await (await fetch(`${base}/metrics`)).text()
      return /vllm:num_requests_waiting\{[^}]*\} 1\.0/.test(text) ? text : undefined
    })
    expect(answered).toBe(false)
    expect(metrics).toMatch(/vllm:num_requests_waiting\{[^}]*\} 1\.0/)
    const t0 = performance.now()
    await fetch(`${base}/wake_up`, { method: 'POST' })
    expect(performance.now() - t0).toBeGreaterThanOrEqual(140)
    const res = await pending
    expect((await res.json()).usage.completion_tokens).toBe(2)
  })

  it('mounts the sleep routes with VLLM_SERVER_DEV_MODE alone; without --enable-sleep-mode a sleep frees nothing', async () => {
    const dir = tempSimDir()
    const noDev = await sleepEngine(dir, { VLLM_SERVER_DEV_MODE: '0', CUDA_VISIBLE_DEVICES: '0' })
    expect((await fetch(`http://127.0.0.1:${noDev.port}/sleep?level=1`, { method: 'POST' })).status).toBe(404)
    expect((await fetch(`http://127.0.0.1:${noDev.port}/is_sleeping`)).status).toBe(404)
    // vLLM mounts the development routes whenever dev mode is on. Without --enable-sleep-mode the V1
    // engine's allocations are outside the sleep allocator's pool: the sleep "succeeds" and frees nothing.
    const noFlag = await spawnEngine(MODEL, ['--gpu-memory-utilization', '0.3'], {
      MODELGATE_SIM_DIR: dir,
      CUDA_VISIBLE_DEVICES: '1',
      VLLM_SERVER_DEV_MODE: '1',
    })
    await waitHealthy(noFlag)
    const base = `http://127.0.0.1:${noFlag.port}`
    const used = () =>
      Number(
        runSmiCli(['--query-gpu=memory.used', '--format=csv,noheader,nounits', '-i', '1'], {
          MODELGATE_SIM_DIR: dir,
        }).stdout.trim(),
      )
    const awake = used()
    expect((await fetch(`${base}/sleep?level=1`, { method: 'POST' })).status).toBe(200)
    expect(await (await fetch(`${base}/is_sleeping`)).json()).toEqual({ is_sleeping: true })
    await noFlag.waitForOutput('Sleep mode freed 0.0 GiB memory')
    expect(used()).toBe(awake)
    expect((await fetch(`${base}/wake_up`, { method: 'POST' })).status).toBe(200)
    expect(await (await fetch(`${base}/is_sleeping`)).json()).toEqual({ is_sleeping: false })
  })

  it('answers 500 on the V0 engine started without --enable-sleep-mode', async () => {
    const e = await spawnEngine(MODEL, ['--gpu-memory-utilization', '0.3'], {
      MODELGATE_SIM_DIR: tempSimDir(),
      VLLM_SERVER_DEV_MODE: '1',
      SIM_VLLM_VERSION: '0.8.5',
    })
    await waitHealthy(e)
    const res = await fetch(`http://127.0.0.1:${e.port}/sleep?level=1`, { method: 'POST' })
    expect(res.status).toBe(500)
    expect(await res.text()).toBe('Internal Server Error')
    // The traceback reaches the engine's stderr pipe on its own schedule, maybe after the answer.
    await waitFor('the assertion in the engine log', () =>
      e.stderr().includes('AssertionError: Sleep mode is not enabled in the model config'),
    )
  })

  it('crashes on inference while asleep when emulating older engines', async () => {
    const e = await sleepEngine(tempSimDir(), { SIM_SLEEP_INFERENCE: 'crash' })
    await fetch(`http://127.0.0.1:${e.port}/sleep?level=1`, { method: 'POST' })
    await postJson(e.port, '/v1/completions', { prompt: 'hi', max_tokens: 2 }).catch(() => undefined)
    expect(await e.exited).toBe(1)
    expect(e.stderr()).toContain('Traceback (most recent call last):')
  })
})
