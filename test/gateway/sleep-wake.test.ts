import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { InstanceSleepEvent, SleepCheck } from '../../plugins/gateway/api.ts'
import type { InstanceRow } from '../../plugins/gateway/db/schema.ts'
import { checkSleep } from '../../plugins/gateway/sleep-wake.ts'
import { groupPids } from '../../src/engine/process.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { readSse } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

/**
 * What a sleep frees and how a wake after level 2 comes back, against simulated engines that
 * behave as vLLM does: level 2 discards the weights (the engine answers garbage until
 * `collective_rpc reload_weights`), and some releases' sleep leaves the weights on the GPU
 * (vllm#32714; the simulator's SIM_SLEEP_KEEPS_WEIGHTS).
 */
const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
type Sleep = {
  status: string
  sleep_verified: boolean | null
  memory_check: SleepCheck
  fallback: string | null
}

const chat = async (gw: TestGateway) => {
  const r = await gw.json<{ choices: { message: { content: string } }[] }>('/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify({
      model: MODEL,
      messages: [{ role: 'user', content: 'what is the capital of France?' }],
      max_tokens: 12,
      temperature: 0,
    }),
  })
  expect(r.status).toBe(200)
  return r.body.choices[0]!.message.content
}

/** engineCalls: the engine's access-log lines for its control endpoints, in order. */
const engineCalls = async (gw: TestGateway, id: string) => {
  const logs = (await gw.json<{ logs: string }>(`/api/v1/models/instances/${id}/logs?lines=500`)).body.logs
  return [...logs.matchAll(/"POST (\/(?:sleep|wake_up|collective_rpc|reset_prefix_cache)\S*) HTTP/g)].map(
    (m) => m[1]!,
  )
}

const sleepEvents = (gw: TestGateway) => {
  const seen: InstanceSleepEvent[] = []
  const off = gw.host.bus.on('gateway.instance.sleep', (e) => seen.push(e))
  return { seen, off }
}

describe('level-2 wake and a verified sleep', () => {
  let gw: TestGateway
  let id = ''
  beforeAll(async () => {
    gw = await startGateway({ ports: [18620, 18629], env: { SIM_WAKE_DELAY_MS: '60' } })
    id = await gw.load({ model_path: MODEL, gpu_ids: [1], enable_sleep_mode: true })
    await gw.waitStatus(id, 'active')
  })
  afterAll(() => gw.stop())

  it('verifies what a level-1 sleep freed, per GPU, with the figures', async () => {
    const events = sleepEvents(gw)
    const s = await gw.json<Sleep>(`/api/models/instances/${id}/sleep?level=1`, { method: 'POST' })
    events.off()
    expect(s.status).toBe(200)
    expect(s.body).toMatchObject({ status: 'sleeping', sleep_verified: true, fallback: null })
    const check = s.body.memory_check
    expect(check).toMatchObject({ verified: true, expected_share: 0.9, reason: null })
    const g = check.gpus['1']!
    expect(g.asleep_gib).toBeLessThan(g.awake_gib * 0.15)
    expect(g.freed_gib).toBeGreaterThanOrEqual(g.required_gib)
    expect(g.releasable_gib).toBeLessThanOrEqual(g.awake_gib)
    expect(events.seen).toEqual([
      expect.objectContaining({ instance_id: id, level: 1, verified: true, fallback: null }),
    ])
    const status = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/sleep-status`)
    expect(status.body).toMatchObject({ sleep_verified: true, memory_check: { verified: true }, wake: null })
    const woke = await gw.json(`/api/models/instances/${id}/wake`, { method: 'POST' })
    expect(woke.body).toMatchObject({ status: 'running', sleep_level: 1, phases: ['wake_up'] })
  })

  it('wakes from level 2 through reload_weights, in vLLM order, and then answers as before', async () => {
    const before = await chat(gw)
    const s = await gw.json<Sleep>(`/api/models/instances/${id}/sleep?level=2`, { method: 'POST' })
    expect(s.body).toMatchObject({ status: 'sleeping', sleep_verified: true })
    expect(s.body.memory_check.expected_share).toBe(0.95)
    // The engine's log lines reach the gateway through a pipe: wait for them rather than read at once.
    const sent = await waitFor('the sleep in the engine log', async () => {
      const calls = await engineCalls(gw, id)
      return calls.at(-1) === '/sleep?level=2&mode=wait' ? calls.length : undefined
    })

    const w = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/wake`, { method: 'POST' })
    expect(w.status).toBe(200)
    expect(w.body).toMatchObject({
      status: 'running',
      sleep_level: 2,
      phases: ['weights', 'reload_weights', 'kv_cache', 'reset_prefix_cache'],
    })
    const woken = await waitFor('the wake calls in the engine log', async () => {
      const calls = (await engineCalls(gw, id)).slice(sent)
      return calls.length >= 4 ? calls : undefined
    })
    expect(woken).toEqual([
      '/wake_up?tags=weights',
      '/collective_rpc',
      '/wake_up?tags=kv_cache',
      '/reset_prefix_cache',
    ])
    const status = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/sleep-status`)
    expect(status.body).toMatchObject({
      status: 'active',
      wake: {
        phases_done: ['weights', 'reload_weights', 'kv_cache', 'reset_prefix_cache'],
        failed_phase: null,
        error: null,
      },
    })
    expect(await chat(gw)).toBe(before)
  })

  it('wakes level 2 by tags: the weights reloaded with their tag, the cache reset once all is awake', async () => {
    const before = await chat(gw)
    await gw.json(`/api/models/instances/${id}/sleep?level=2`, { method: 'POST' })
    const part = await gw.json(`/api/models/instances/${id}/wake`, {
      method: 'POST',
      body: JSON.stringify({ tags: 'weights' }),
    })
    expect(part.body).toMatchObject({ status: 'sleeping', phases: ['weights', 'reload_weights'] })
    const half = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/sleep-status`)
    expect(half.body).toMatchObject({
      status: 'sleeping',
      engine_is_sleeping: true,
      wake: { phases_done: ['weights', 'reload_weights'], failed_phase: null },
    })
    const rest = await gw.json(`/api/models/instances/${id}/wake`, {
      method: 'POST',
      body: JSON.stringify({ tags: ['kv_cache'] }),
    })
    expect(rest.body).toMatchObject({ status: 'running', phases: ['kv_cache', 'reset_prefix_cache'] })
    expect(await chat(gw)).toBe(before)
  })
})

describe('a sleep that frees too little (vllm#32714)', () => {
  const boot = (ports: [number, number], fallback: string) =>
    startGateway({
      ports,
      env: { SIM_WAKE_DELAY_MS: '60', SIM_SLEEP_KEEPS_WEIGHTS: '1' },
      extraYaml: `    sleep: { verify_fallback: ${fallback} }\n`,
    })

  it('is reported (sleep_verified false, error event, bus event) and stays asleep under warn', async () => {
    const gw = await boot([18630, 18634], 'warn')
    try {
      const id = await gw.load({ model_path: MODEL, gpu_ids: [0], enable_sleep_mode: true })
      await gw.waitStatus(id, 'active')
      const events = sleepEvents(gw)
      const s = await gw.json<Sleep>(`/api/models/instances/${id}/sleep?level=1`, { method: 'POST' })
      events.off()
      expect(s.status).toBe(200)
      expect(s.body).toMatchObject({ status: 'sleeping', sleep_verified: false, fallback: 'warn' })
      const g = s.body.memory_check.gpus['0']!
      expect(g.freed_gib).toBeLessThan(g.required_gib)
      expect(s.body.memory_check.reason).toStartWith(`GPU 0 freed ${g.freed_gib} of ${g.awake_gib} GiB`)
      expect(events.seen).toEqual([expect.objectContaining({ level: 1, verified: false, fallback: 'warn' })])
      const errors = await readSse<{ data: { message: string; source: string } }>(
        await fetch(`${gw.url}/api/v1/models/instances/${id}/events?types=error`),
        'the error event of the sleep check',
        (m) => m.length > 0,
      )
      expect(errors[0]!.data.data).toMatchObject({ source: 'sleep_check' })
      expect(errors[0]!.data.data.message).toContain('freed less GPU memory than expected')
      const status = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/sleep-status`)
      expect(status.body).toMatchObject({ status: 'sleeping', sleep_verified: false })
    } finally {
      await gw.stop()
    }
  })

  it('unloads the engine under verify_fallback: unload', async () => {
    const gw = await boot([18635, 18639], 'unload')
    try {
      const id = await gw.load({ model_path: MODEL, gpu_ids: [0], enable_sleep_mode: true })
      await gw.waitStatus(id, 'active')
      const s = await gw.json<Sleep>(`/api/models/instances/${id}/sleep?level=2`, { method: 'POST' })
      expect(s.status).toBe(200)
      expect(s.body).toMatchObject({ status: 'stopping', sleep_verified: false, fallback: 'unload' })
      await waitFor(
        'the unverified instance unloaded',
        async () => (await gw.json(`/api/v1/models/${id}`)).status === 404,
        { wake: (notify) => gw.host.bus.on('gateway.instance.status', notify), timeoutMs: 15_000 },
      )
    } finally {
      await gw.stop()
    }
  })
})

/**
 * kvcached maps a shared-cache engine's KV pages outside vLLM's sleep allocator: its sleep frees the
 * weights and nothing else, which is what the check expects of it (and the simulator does). The
 * release is one whose start-up summary is DEBUG (0.11–0.20), so the engine's KV figure comes from
 * kvcached's own line alone.
 */
describe('the sleep of a shared-cache engine (kvcached)', () => {
  const shm = mkdtempSync(join(tmpdir(), 'modelgate-shm-'))
  let gw: TestGateway
  beforeAll(async () => {
    gw = await startGateway({
      ports: [18660, 18669],
      env: { SIM_WAKE_DELAY_MS: '60', SIM_VLLM_VERSION: '0.20.2' },
      shmDir: shm,
      extraYaml: '    sleep: { verify_fallback: unload }\n    sharedcache: { enabled: true }\n',
    })
  })
  afterAll(async () => {
    await gw.stop()
    rmSync(shm, { recursive: true, force: true })
  })

  it('has memory figures from kvcached’s line, and its level-1 sleep is verified against the weights', async () => {
    const id = await gw.load({ model_path: MODEL, gpu_ids: [0], enable_sleep_mode: true })
    const ready = await gw.waitStatus(id, 'active')
    expect(ready.sharedcache_enabled).toBe(true)
    const profile = await gw.json<{
      profile: { kv_cache_available_gib: number; weights_memory_gib: number }
    }>('/api/memory/profiles', {
      method: 'POST',
      body: JSON.stringify({ instanceId: id, profileName: 'shared 7b' }),
    })
    expect(profile.status).toBe(201)
    const { weights_memory_gib: weights, kv_cache_available_gib: kv } = profile.body.profile
    expect(kv).toBeGreaterThan(weights)

    const s = await gw.json<Sleep>(`/api/models/instances/${id}/sleep?level=1`, { method: 'POST' })
    expect(s.status).toBe(200)
    expect(s.body).toMatchObject({ status: 'sleeping', sleep_verified: true, fallback: null })
    expect(s.body.memory_check).toMatchObject({ verified: true, releases: 'weights', reason: null })
    const g = s.body.memory_check.gpus['0']!
    expect(g.releasable_gib).toBe(Math.round(weights * 100) / 100)
    // What stays is everything but the weights: the KV pages kvcached mapped, CUDA graphs, overhead.
    expect(g.freed_gib).toBeCloseTo(weights, 1)
    expect(g.asleep_gib).toBeGreaterThan(0)
    const woke = await gw.json(`/api/models/instances/${id}/wake`, { method: 'POST' })
    expect(woke.body).toMatchObject({ status: 'running', sleep_level: 1 })
  })
})

describe('the check of a shared-cache engine whose log gave no figures', () => {
  it('is unknown (null) with the reason, not a failure that would unload it', () => {
    const row = { gpu_ids: [0], memory_metrics: null, sharedcache_enabled: true } as unknown as InstanceRow
    const check = checkSleep(
      { row },
      1,
      { mibByGpu: new Map([[0, 20_000]]) },
      { mibByGpu: new Map([[0, 6_000]]) },
    )
    expect(check).toMatchObject({ verified: null, releases: 'weights', gpus: {} })
    expect(check.reason).toContain('weights of this shared-cache engine are not known')
  })
})

describe('a sleep nvidia-smi cannot attribute', () => {
  it('says sleep_verified null with the reason (another PID namespace)', async () => {
    // nvidia-smi sees another simulated host: the engine's processes are not among its compute apps.
    const gw = await startGateway({ ports: [18640, 18644], smiSimDir: '/nonexistent-modelgate-smi' })
    try {
      const id = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [0], enable_sleep_mode: true })
      await gw.waitStatus(id, 'active')
      const s = await gw.json<Sleep>(`/api/models/instances/${id}/sleep`, { method: 'POST' })
      expect(s.status).toBe(200)
      expect(s.body).toMatchObject({ status: 'sleeping', sleep_verified: null, fallback: null })
      expect(s.body.memory_check.reason).toBe(
        "nvidia-smi shows no process of the engine's group on GPU 0 (another PID namespace?)",
      )
    } finally {
      await gw.stop()
    }
  })
})

describe('a level-2 wake that fails half-way', () => {
  it('leaves the instance sleeping (never serving unloaded weights), says where it stopped, and an error event', async () => {
    const gw = await startGateway({
      ports: [18645, 18649],
      // The reload takes 3 s, time to kill the engine core in the middle of it; the API server stays up.
      env: { SIM_WAKE_DELAY_MS: '60', SIM_RELOAD_DELAY_MS: '3000', VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: '1' },
    })
    try {
      const id = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [0], enable_sleep_mode: true })
      const model = await gw.waitStatus(id, 'active')
      const leader = model.process_id as number
      const s = await gw.json<Sleep>(`/api/models/instances/${id}/sleep?level=2`, { method: 'POST' })
      expect(s.body.status).toBe('sleeping')

      const wake = gw.json<{ error: { code: string; message: string } }>(`/api/models/instances/${id}/wake`, {
        method: 'POST',
      })
      await waitFor('the engine reloading its weights', async () => {
        const logs = (await gw.json<{ logs: string }>(`/api/v1/models/instances/${id}/logs?lines=500`)).body
          .logs
        return logs.includes('Reloading weights inplace')
      })
      // The engine core (the leader's children in its process group) dies during the reload.
      for (const pid of groupPids(leader)) if (pid !== leader) process.kill(pid, 'SIGKILL')
      const failed = await wake
      expect(failed.status).toBe(502)
      expect(failed.body.error.code).toBe('ENGINE_ERROR')
      expect(failed.body.error.message).toStartWith(
        'wake failed at kv_cache after weights, reload_weights: engine POST /wake_up?tags=kv_cache answered 500',
      )
      expect(failed.body.error.message).toEndWith(
        'the instance stays sleeping (not routed) until a wake finishes',
      )

      const status = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/sleep-status`)
      expect(status.body).toMatchObject({
        status: 'sleeping',
        operation: null,
        wake: { phases_done: ['weights', 'reload_weights'], failed_phase: 'kv_cache' },
      })
      const errors = await readSse<{ data: { source: string; phase: string } }>(
        await fetch(`${gw.url}/api/v1/models/instances/${id}/events?types=error`),
        'the error event of the failed wake',
        (m) => m.length > 0,
      )
      expect(errors[0]!.data.data).toMatchObject({ source: 'wake', phase: 'kv_cache' })
      expect((await gw.json<{ model: { status: string } }>(`/api/v1/models/${id}`)).body.model.status).toBe(
        'sleeping',
      )
    } finally {
      await gw.stop()
    }
  })
})
