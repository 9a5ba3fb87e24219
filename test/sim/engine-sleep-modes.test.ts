import { afterEach, describe, expect, it } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { readSleepLevel, VllmClient } from '../../src/engine/vllm-client.ts'
import { readKvcachedSegment } from '../../src/gpu/kvcached.ts'
import { waitFor } from '../support/wait.ts'
import {
  cleanupSims,
  metricValue,
  openStream,
  postJson,
  smiUsedMib,
  spawnEngine,
  tempSimDir,
  waitHealthy,
} from './helpers.ts'

/**
 * Sleep as real vLLM does it (versions.ts): current releases take `/sleep?level=&mode=` and abort the
 * requests running on the engine by default; `wait` lets them finish first, `keep` freezes them until
 * the wake-up; older releases have no `mode`. Level 2 discards the weights: a plain wake-up answers
 * garbage until `collective_rpc reload_weights`. Some releases free little (vllm#32714).
 */
afterEach(cleanupSims)

const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
const BUDGET = Math.floor(0.5 * 81559)
const WEIGHTS = Math.round(((7.62e9 * 2) / 2 ** 30) * 1024)
const IDLE = 4
const chat = (max: number) => ({
  messages: [{ role: 'user', content: 'tell me about the river' }],
  max_tokens: max,
  ignore_eos: true,
})

async function engine(dir: string, env: Record<string, string> = {}) {
  const e = await spawnEngine(MODEL, ['--enable-sleep-mode', '--gpu-memory-utilization', '0.5'], {
    MODELGATE_SIM_DIR: dir,
    CUDA_VISIBLE_DEVICES: '0',
    VLLM_SERVER_DEV_MODE: '1',
    SIM_WAKE_DELAY_MS: '150',
    SIM_RELOAD_DELAY_MS: '100',
    SIM_TOKENS_PER_SEC: '50',
    ...env,
  })
  await waitHealthy(e)
  return e
}

const post = (port: number, path: string) => fetch(`http://127.0.0.1:${port}${path}`, { method: 'POST' })
const isSleeping = async (port: number) =>
  ((await (await fetch(`http://127.0.0.1:${port}/is_sleeping`)).json()) as { is_sleeping: boolean })
    .is_sleeping
const parse = (frame: string | undefined) => JSON.parse(frame ?? '{}')

async function chatText(port: number, max = 5): Promise<string> {
  const res = await postJson(port, '/v1/chat/completions', chat(max))
  expect(res.status).toBe(200)
  return (await res.json()).choices[0].message.content
}

describe('sim engine sleep modes (current vLLM: /sleep?level=&mode=, abort by default)', () => {
  it('aborts the requests in flight by default: finish_reason "abort", then [DONE]', async () => {
    const dir = tempSimDir()
    const e = await engine(dir)
    const stream = await openStream(e.port, '/v1/chat/completions', {
      ...chat(200),
      stream_options: { include_usage: true },
    })
    const whole = postJson(e.port, '/v1/completions', {
      prompt: 'the river',
      max_tokens: 200,
      ignore_eos: true,
    })
    await stream.waitTokens(3)
    expect((await post(e.port, '/sleep?level=1')).status).toBe(200)

    const frames = await stream.done
    expect(frames.at(-1)).toBe('[DONE]')
    const usage = parse(frames.at(-2))
    expect(usage.choices).toEqual([])
    const last = parse(frames.at(-3))
    expect(last.choices).toEqual([
      { index: 0, delta: {}, logprobs: null, finish_reason: 'abort', stop_reason: null },
    ])
    expect(usage.usage.completion_tokens).toBeGreaterThanOrEqual(3)
    expect(usage.usage.completion_tokens).toBeLessThan(200)

    const body = await (await whole).json()
    expect(body.choices[0].finish_reason).toBe('abort')
    expect(body.usage.completion_tokens).toBeLessThan(200)
    expect(
      await metricValue(
        e.port,
        'vllm:request_success_total{model_name="Qwen/Qwen2.5-7B-Instruct",engine="0",finished_reason="abort"}',
      ),
    ).toBe(2)
    expect(await isSleeping(e.port)).toBe(true)
    expect(smiUsedMib(dir, 0)).toBe(IDLE + Math.round(BUDGET * 0.1))

    // A request arriving while asleep waits for the wake-up, then runs in full.
    const queued = postJson(e.port, '/v1/completions', { prompt: 'x', max_tokens: 3, ignore_eos: true })
    await waitFor(
      'the request to queue',
      async () => (await metricValue(e.port, 'vllm:num_requests_waiting')) === 1,
    )
    expect((await post(e.port, '/wake_up')).status).toBe(200)
    const after = await (await queued).json()
    expect(after.choices[0].finish_reason).toBe('length')
    expect(after.usage.completion_tokens).toBe(3)
  })

  it('with mode=wait lets the requests in flight finish first, and holds new ones until the wake-up', async () => {
    const dir = tempSimDir()
    const e = await engine(dir)
    const stream = await openStream(e.port, '/v1/completions', {
      prompt: 'a',
      max_tokens: 25,
      ignore_eos: true,
    })
    await stream.waitTokens(2)
    let slept = false
    const sleeping = post(e.port, '/sleep?level=1&mode=wait').then((r) => {
      slept = true
      return r
    })
    await waitFor('the scheduler to pause', () => isSleeping(e.port))
    const late = postJson(e.port, '/v1/completions', { prompt: 'late', max_tokens: 3, ignore_eos: true })
    const frames = await stream.done
    expect(frames.at(-1)).toBe('[DONE]')
    expect(stream.tokens()).toBe(25)
    expect(parse(frames.at(-2)).choices[0].finish_reason).toBe('length')
    expect((await sleeping).status).toBe(200)
    expect(slept).toBe(true)
    await e.waitForOutput('to fall asleep.')
    expect(smiUsedMib(dir, 0)).toBe(IDLE + Math.round(BUDGET * 0.1))
    expect(await metricValue(e.port, 'vllm:num_requests_waiting')).toBe(1)
    expect((await post(e.port, '/wake_up')).status).toBe(200)
    expect((await (await late).json()).usage.completion_tokens).toBe(3)
  })

  it('with mode=keep freezes the requests in flight and resumes them after the wake-up', async () => {
    const e = await engine(tempSimDir())
    const stream = await openStream(e.port, '/v1/completions', {
      prompt: 'a',
      max_tokens: 20,
      ignore_eos: true,
    })
    await stream.waitTokens(2)
    expect((await post(e.port, '/sleep?level=1&mode=keep')).status).toBe(200)
    const frozen = stream.tokens()
    await Bun.sleep(200) // an absence: a stream that went on would have sent ~10 more tokens
    expect(stream.tokens()).toBe(frozen)
    expect((await post(e.port, '/wake_up')).status).toBe(200)
    const frames = await stream.done
    expect(stream.tokens()).toBe(20)
    expect(parse(frames.at(-2)).choices[0].finish_reason).toBe('length')
  })

  it('pauses the scheduler only at level 0, until a wake-up with tags=scheduling', async () => {
    const dir = tempSimDir()
    const e = await engine(dir)
    expect((await post(e.port, '/sleep?level=0')).status).toBe(200)
    expect(await isSleeping(e.port)).toBe(true)
    expect(smiUsedMib(dir, 0)).toBe(IDLE + BUDGET)
    const queued = postJson(e.port, '/v1/completions', { prompt: 'x', max_tokens: 2, ignore_eos: true })
    await waitFor(
      'the request to queue',
      async () => (await metricValue(e.port, 'vllm:num_requests_waiting')) === 1,
    )
    expect((await post(e.port, '/wake_up?tags=scheduling')).status).toBe(200)
    expect((await (await queued).json()).usage.completion_tokens).toBe(2)
    expect(await isSleeping(e.port)).toBe(false)
  })

  it('fails an unknown mode in the engine core: 500, and nothing sleeps', async () => {
    const dir = tempSimDir()
    const e = await engine(dir)
    const res = await post(e.port, '/sleep?level=1&mode=later')
    expect(res.status).toBe(500)
    expect(await res.json()).toEqual({
      error: {
        message: 'Call to sleep method failed: Invalid pause mode: later',
        type: 'InternalServerError',
        param: null,
        code: 500,
      },
    })
    expect(e.stdout()).toMatch(/\(EngineCore pid=\d+\) ERROR .* Invocation of sleep method failed/)
    expect(await isSleeping(e.port)).toBe(false)
    expect(smiUsedMib(dir, 0)).toBe(IDLE + BUDGET)
  })

  it('has mode from 0.17.0: 0.16 ignores it (a stream runs on), 0.17.0 checks it', async () => {
    const old = await engine(tempSimDir(), { SIM_VLLM_VERSION: '0.16.0' })
    expect((await post(old.port, '/sleep?level=1&mode=later')).status).toBe(200)
    expect(await isSleeping(old.port)).toBe(true)
    const current = await engine(tempSimDir(), { SIM_VLLM_VERSION: '0.17.0' })
    expect((await post(current.port, '/sleep?level=1&mode=later')).status).toBe(500)
    const stream = await openStream(current.port, '/v1/completions', {
      prompt: 'a',
      max_tokens: 200,
      ignore_eos: true,
    })
    await stream.waitTokens(2)
    expect((await post(current.port, '/sleep?level=1&mode=abort')).status).toBe(200)
    await stream.done
    expect(stream.tokens()).toBeLessThan(200)
  })

  it('takes any wake tag: one that is not asleep, or unknown, wakes nothing and answers 200', async () => {
    const dir = tempSimDir()
    const e = await engine(dir)
    expect((await post(e.port, '/sleep?level=1')).status).toBe(200)
    const asleep = smiUsedMib(dir, 0)
    expect((await post(e.port, '/wake_up?tags=bogus')).status).toBe(200)
    await e.waitForOutput(/WARNING .* Tag bogus is not in sleeping tags \{'weights', 'kv_cache'\}/)
    expect(await isSleeping(e.port)).toBe(true)
    expect(smiUsedMib(dir, 0)).toBe(asleep)
    expect((await post(e.port, '/wake_up?tags=weights')).status).toBe(200)
    expect(smiUsedMib(dir, 0)).toBe(asleep + WEIGHTS)
    // The weights are awake already: vLLM's executor wakes neither tag of this call.
    expect((await post(e.port, '/wake_up?tags=kv_cache&tags=weights')).status).toBe(200)
    await e.waitForOutput("Tag weights is not in sleeping tags {'kv_cache'}")
    expect(await isSleeping(e.port)).toBe(true)
    expect(smiUsedMib(dir, 0)).toBe(asleep + WEIGHTS)
    expect((await post(e.port, '/wake_up?tags=kv_cache')).status).toBe(200)
    expect(await isSleeping(e.port)).toBe(false)
    expect(smiUsedMib(dir, 0)).toBe(IDLE + BUDGET)
  })

  it('has no mode on older releases: a stream in flight stalls across the sleep and resumes', async () => {
    const e = await engine(tempSimDir(), { SIM_VLLM_VERSION: '0.11.0' })
    const stream = await openStream(e.port, '/v1/completions', {
      prompt: 'a',
      max_tokens: 15,
      ignore_eos: true,
    })
    await stream.waitTokens(2)
    expect((await post(e.port, '/sleep?level=1&mode=abort')).status).toBe(200)
    expect((await post(e.port, '/wake_up')).status).toBe(200)
    await stream.done
    expect(stream.tokens()).toBe(15)
  })

  it('dies on older releases when a stream runs into the sleep and SIM_SLEEP_INFERENCE=crash', async () => {
    const e = await engine(tempSimDir(), { SIM_VLLM_VERSION: '0.11.0', SIM_SLEEP_INFERENCE: 'crash' })
    const stream = await openStream(e.port, '/v1/completions', {
      prompt: 'a',
      max_tokens: 50,
      ignore_eos: true,
    })
    await stream.waitTokens(2)
    await post(e.port, '/sleep?level=1').catch(() => undefined)
    expect(await e.exited).toBe(1)
    expect(e.stderr()).toContain('an illegal memory access was encountered')
  })
})

describe('sim engine level-2 sleep (weights discarded)', () => {
  it('answers garbage after a plain wake-up until collective_rpc reload_weights', async () => {
    const e = await engine(tempSimDir())
    expect(await chatText(e.port)).toMatch(/^\w+( \w+){4}$/)
    expect((await post(e.port, '/sleep?level=2')).status).toBe(200)
    expect((await post(e.port, '/wake_up')).status).toBe(200)
    expect(await isSleeping(e.port)).toBe(false)
    expect(await chatText(e.port)).toBe('!!!!!')
    const rpc = await postJson(e.port, '/collective_rpc', { method: 'reload_weights' })
    expect(rpc.status).toBe(200)
    expect(await rpc.json()).toEqual({ results: [null] })
    await e.waitForOutput('Reloading weights inplace...')
    expect(await chatText(e.port)).toMatch(/^\w+( \w+){4}$/)
  })

  it("runs vLLM's documented wake sequence: weights, reload_weights, kv_cache, reset_prefix_cache", async () => {
    const dir = tempSimDir()
    const e = await engine(dir)
    expect((await post(e.port, '/sleep?level=2')).status).toBe(200)
    const residual = Math.round(BUDGET * 0.05)
    expect(smiUsedMib(dir, 0)).toBe(IDLE + residual)
    expect((await post(e.port, '/wake_up?tags=weights')).status).toBe(200)
    expect(smiUsedMib(dir, 0)).toBe(IDLE + residual + WEIGHTS)
    expect((await postJson(e.port, '/collective_rpc', { method: 'reload_weights' })).status).toBe(200)
    expect(await isSleeping(e.port)).toBe(true)
    expect((await post(e.port, '/wake_up?tags=kv_cache')).status).toBe(200)
    expect((await post(e.port, '/reset_prefix_cache')).status).toBe(200)
    expect(smiUsedMib(dir, 0)).toBe(IDLE + BUDGET)
    expect(await isSleeping(e.port)).toBe(false)
    expect(await chatText(e.port)).toMatch(/^\w+( \w+){4}$/)
    const out = e.stdout()
    const order = [
      'to fall asleep.',
      "wake up the engine with tags: ['weights']",
      "seconds to wake up tags ['weights'].",
      'Reloading weights inplace...',
      'Loading weights took',
      "seconds to wake up tags ['kv_cache'].",
      'Resetting prefix cache...',
    ]
    let at = -1
    for (const text of order) {
      const i = out.indexOf(text, at + 1)
      expect(i).toBeGreaterThan(at)
      at = i
    }
  })

  it('answers collective_rpc like vLLM: 400 without a method, 500 for one the workers lack', async () => {
    const e = await engine(tempSimDir())
    const missing = await postJson(e.port, '/collective_rpc', {})
    expect(missing.status).toBe(400)
    // The route's HTTPException, rendered by vLLM's handler in its error shape.
    expect(await missing.json()).toEqual({
      error: { message: "Missing 'method' in request body", type: 'Bad Request', param: null, code: 400 },
    })
    const unknown = await postJson(e.port, '/collective_rpc', { method: 'nope' })
    expect(unknown.status).toBe(500)
    expect((await unknown.json()).error.message).toBe("Method 'nope' is not implemented.")
  })

  it('dies when reload_weights runs before the weights are woken', async () => {
    const e = await engine(tempSimDir())
    expect((await post(e.port, '/sleep?level=2')).status).toBe(200)
    await postJson(e.port, '/collective_rpc', { method: 'reload_weights' }).catch(() => undefined)
    expect(await e.exited).toBe(1)
    expect(e.stderr()).toContain('RuntimeError: CUDA error: an illegal memory access was encountered')
  })
})

describe('sim engine sleep that frees little (vllm#32714)', () => {
  it('answers 200 and logs its figures, while nvidia-smi shows the weights still held', async () => {
    const dir = tempSimDir()
    const e = await engine(dir, { SIM_SLEEP_KEEPS_WEIGHTS: '1' })
    expect((await post(e.port, '/sleep?level=1')).status).toBe(200)
    const kept = Math.round(BUDGET * 0.1) + WEIGHTS
    expect(smiUsedMib(dir, 0)).toBe(IDLE + kept)
    const freed = Math.round(((BUDGET - kept) / 1024) * 100) / 100
    await e.waitForOutput(`Sleep mode freed ${freed} GiB memory`)
    expect(await isSleeping(e.port)).toBe(true)
    // The weights never left the GPU: after a level-2 sleep they are still good.
    expect((await post(e.port, '/wake_up')).status).toBe(200)
    expect((await post(e.port, '/sleep?level=2')).status).toBe(200)
    expect(smiUsedMib(dir, 0)).toBe(IDLE + Math.round(BUDGET * 0.05) + WEIGHTS)
    expect((await post(e.port, '/wake_up')).status).toBe(200)
    expect(await chatText(e.port)).toMatch(/^\w+( \w+){4}$/)
  })

  it('is what 0.14 does by default', async () => {
    const dir = tempSimDir()
    const e = await engine(dir, { SIM_VLLM_VERSION: '0.14.0' })
    expect((await post(e.port, '/sleep?level=1')).status).toBe(200)
    expect(smiUsedMib(dir, 0)).toBe(IDLE + Math.round(BUDGET * 0.1) + WEIGHTS)
  })
})

describe('sim engine sleep state metric', () => {
  const series = (state: string) =>
    `vllm:engine_sleep_state{model_name="${MODEL}",engine="0",sleep_state="${state}"}`

  it('reports awake / weights_offloaded / discard_all as vLLM does', async () => {
    const e = await engine(tempSimDir())
    const state = async () => ({
      awake: await metricValue(e.port, series('awake')),
      weights_offloaded: await metricValue(e.port, series('weights_offloaded')),
      discard_all: await metricValue(e.port, series('discard_all')),
    })
    expect(await state()).toEqual({ awake: 1, weights_offloaded: 0, discard_all: 0 })
    await post(e.port, '/sleep?level=1')
    expect(await state()).toEqual({ awake: 0, weights_offloaded: 1, discard_all: 0 })
    await post(e.port, '/wake_up')
    await post(e.port, '/sleep?level=2')
    expect(await state()).toEqual({ awake: 0, weights_offloaded: 0, discard_all: 1 })
    // vLLM records (0, 0) on every wake_up call, a partial one included.
    await post(e.port, '/wake_up?tags=weights')
    expect(await state()).toEqual({ awake: 1, weights_offloaded: 0, discard_all: 0 })
  })

  it('is absent from older releases and exported from 0.11.1', async () => {
    const e = await engine(tempSimDir(), { SIM_VLLM_VERSION: '0.11.0' })
    expect(await metricValue(e.port, 'vllm:engine_sleep_state')).toBeUndefined()
    const newer = await engine(tempSimDir(), { SIM_VLLM_VERSION: '0.11.1' })
    expect(await metricValue(newer.port, series('awake'))).toBe(1)
  })
})

describe('sim engine sleep of a kvcached engine', () => {
  it('frees the weights only: the KV pages are kvcached’s, outside the sleep allocator', async () => {
    const dir = tempSimDir()
    const shm = tempSimDir()
    const e = await engine(dir, {
      ENABLE_KVCACHED: 'true',
      MODELGATE_SHM_DIR: shm,
      KVCACHED_IPC_NAME: 'sleepy',
    })
    const awake = smiUsedMib(dir, 0)
    const segment = readKvcachedSegment('sleepy', shm)
    expect(segment?.preallocBytes).toBe(2 * 2 ** 30)
    expect((await post(e.port, '/sleep?level=1')).status).toBe(200)
    expect(smiUsedMib(dir, 0)).toBe(awake - WEIGHTS)
    await e.waitForOutput(`Sleep mode freed ${Math.round((WEIGHTS / 1024) * 100) / 100} GiB memory`)
    expect(readKvcachedSegment('sleepy', shm)).toEqual(segment)
    expect((await post(e.port, '/wake_up')).status).toBe(200)
    expect(smiUsedMib(dir, 0)).toBe(awake)
    expect(await chatText(e.port)).toMatch(/^\w+( \w+){4}$/)
    // Level 2 discards the weights all the same: garbage until reload_weights.
    expect((await post(e.port, '/sleep?level=2')).status).toBe(200)
    expect(smiUsedMib(dir, 0)).toBe(awake - WEIGHTS)
    expect((await post(e.port, '/wake_up')).status).toBe(200)
    expect(await chatText(e.port)).toBe('!!!!!')
  })
})

describe('sim engine sleep components (current builds, 0.30)', () => {
  const states = async (port: number) => {
    const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()
    const on = [
      ...text.matchAll(/^vllm:engine_sleep_component_state\{[^}]*component="(\w+)",state="(\w+)"\} 1\.0$/gm),
    ]
    return Object.fromEntries(on.map((m) => [m[1], m[2]]))
  }

  it('exports the component gauge instead of vllm:engine_sleep_state, in the states vLLM reports', async () => {
    const e = await engine(tempSimDir(), { SIM_VLLM_VERSION: '0.30.0' })
    expect(await metricValue(e.port, 'vllm:engine_sleep_state')).toBeUndefined()
    expect(await states(e.port)).toEqual({ scheduler: 'running', weights: 'resident', kv_cache: 'resident' })
    await post(e.port, '/sleep?level=1')
    expect(await states(e.port)).toEqual({ scheduler: 'paused', weights: 'offloaded', kv_cache: 'discarded' })
    await post(e.port, '/wake_up')
    await post(e.port, '/sleep?level=2')
    expect(await states(e.port)).toEqual({ scheduler: 'paused', weights: 'discarded', kv_cache: 'discarded' })
    await post(e.port, '/wake_up?tags=weights')
    expect(await states(e.port)).toEqual({ scheduler: 'paused', weights: 'resident', kv_cache: 'discarded' })
  })

  it('frees the KV cache alone with /release_kv_cache_memory, and times each operation', async () => {
    const e = await engine(tempSimDir(), { SIM_VLLM_VERSION: '0.30.0' })
    const client = new VllmClient(`http://127.0.0.1:${e.port}`)
    expect(await client.canReleaseKvCache()).toBe(true)
    await client.releaseKvCache()
    expect(await states(e.port)).toEqual({ scheduler: 'paused', weights: 'resident', kv_cache: 'discarded' })
    expect(await isSleeping(e.port)).toBe(true)
    await client.wake(['kv_cache'])
    expect(await isSleeping(e.port)).toBe(false)
    expect(await chatText(e.port)).toMatch(/^\w+( \w+){4}$/)
    await client.sleep(1)
    await client.wakeUp(1)
    const seconds = await client.sleepOperationSeconds()
    expect(seconds?.sleep).toBeGreaterThan(0)
    expect(seconds?.wake).toBeGreaterThan(0)
    expect(seconds?.release_kv_cache_memory).toBeGreaterThan(0)

    const old = await engine(tempSimDir(), { SIM_VLLM_VERSION: '0.29.0' })
    const oldClient = new VllmClient(`http://127.0.0.1:${old.port}`)
    expect(await oldClient.canReleaseKvCache()).toBe(false)
    expect((await post(old.port, '/release_kv_cache_memory')).status).toBe(404)
    expect(await oldClient.sleepOperationSeconds()).toBeNull()
  })
})

describe('sim engine sleep gauge per release boundary (test/fixtures/vllm-metrics)', () => {
  for (const [version, level] of [
    ['0.11.0', 1],
    ['0.11.1', 1],
    ['0.29.0', 2],
    ['0.30.0', 1],
  ] as const)
    it(`says what vLLM ${version} says while asleep at level ${level}`, async () => {
      const e = await engine(tempSimDir(), { SIM_VLLM_VERSION: version })
      expect((await post(e.port, `/sleep?level=${level}`)).status).toBe(200)
      const sim = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text()
      const real = readFileSync(
        join(import.meta.dir, '..', 'fixtures', 'vllm-metrics', `${version}.prom`),
        'utf8',
      )
      expect(readSleepLevel(sim)).toEqual(readSleepLevel(real))
    })
})
