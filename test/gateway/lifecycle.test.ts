import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { groupGone, startGateway, type TestGateway } from '../support/gateway.ts'
import { readSse } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

type Gpu = { index: number; memory_used_mb: number; memory_free_mb: number; models_loaded: number }
type Multi = {
  gpus: { gpu_index: number; used_gb: number; models: { instance_id: string; display_name: string }[] }[]
}

describe('gateway lifecycle against simulated engines', () => {
  let gw: TestGateway
  beforeAll(async () => {
    // Wakes are not timed here: the simulator wakes in 20–60 ms instead of its default 100–300 ms.
    gw = await startGateway({ ports: [18100, 18119], env: { SIM_WAKE_DELAY_MS: '60' } })
  })
  afterAll(() => gw.stop())

  const gpus = async () => (await gw.json<{ gpus: Gpu[] }>('/api/gpu/available')).body.gpus

  it('loads a model to active, seen on the event stream, with memory metrics, logs and moved GPU views', async () => {
    const before = await gpus()
    expect(before.map((g) => g.models_loaded)).toEqual([0, 0])
    const res = await gw.json<Record<string, unknown>>('/api/v1/models/load', {
      method: 'POST',
      body: JSON.stringify({ model_path: 'Qwen/Qwen2.5-7B-Instruct', gpu_ids: [1], enable_sleep_mode: true }),
    })
    expect(res.status).toBe(202)
    expect(res.body).toMatchObject({ status: 'starting', model: 'Qwen/Qwen2.5-7B-Instruct' })
    const id = res.body.instance_id as string
    const port = res.body.port as number
    expect(port).toBeGreaterThanOrEqual(18100)

    const stream = await fetch(`${gw.url}/api/v1/models/instances/${id}/events?types=status,progress`)
    expect(stream.headers.get('content-type')).toContain('text/event-stream')
    const events = await readSse(stream, `instance ${id}'s status event 'active'`, (evs) =>
      evs.some(
        (e) =>
          e.event === 'status' &&
          (e.data as { data: { currentStatus: string } }).data.currentStatus === 'active',
      ),
    )
    const status = events
      .filter((e) => e.event === 'status')
      .map((e) => (e.data as { data: Record<string, unknown> }).data)
    expect(status.at(-1)).toMatchObject({ previousStatus: 'starting', currentStatus: 'active' })
    expect(events.some((e) => e.event === 'log')).toBe(false)
    const progress = events
      .filter((e) => e.event === 'progress')
      .map((e) => (e.data as { data: { percent: number } }).data.percent)
    expect(progress.at(-1)).toBe(100)

    const model = await gw.waitStatus(id, 'active')
    expect(model.ready_at).toBeString()
    expect(model.max_tokens).toBe(32768)
    const mm = model.memory_metrics as Record<string, number>
    expect(mm.weights_memory_gib).toBeGreaterThan(13)
    expect(mm.kv_cache_available_gib).toBeGreaterThan(0)
    expect(mm.max_model_len).toBe(32768)
    const baseline = model.memory_baseline_by_gpu as Record<string, number>
    expect(Object.keys(baseline)).toEqual(['1'])
    expect(model.launch_command).toContain('--port')

    const logs = await gw.json<{ logs: string; line_count: number }>(
      `/api/v1/models/instances/${id}/logs?lines=500`,
    )
    expect(logs.status).toBe(200)
    expect(logs.body.logs).toContain('[stdout]')
    expect(logs.body.logs).toContain('Model loading took')
    expect(logs.body.logs).toContain('[stderr] INFO:     Application startup complete.')
    const two = await gw.json<{ line_count: number }>(`/api/v1/models/instances/${id}/logs?lines=2`)
    expect(two.body.line_count).toBe(2)

    const after = await gpus()
    expect(after[1]!.models_loaded).toBe(1)
    const grew = (after[1]!.memory_used_mb - before[1]!.memory_used_mb) / 1024
    expect(Math.abs(grew - baseline['1']!)).toBeLessThan(0.05)
    expect(after[0]!.memory_used_mb).toBe(before[0]!.memory_used_mb)

    const multi = (await gw.json<Multi>('/api/memory/usage/multi-gpu')).body
    expect(multi.gpus[1]!.models.map((m) => m.instance_id)).toEqual([id])
    expect(multi.gpus[0]!.models).toEqual([])
    const single = (await gw.json<{ kvcache?: unknown; models: unknown[] }>('/api/memory/usage')).body
    expect(single.kvcache).toBeDefined()
    expect(single.models).toHaveLength(1)

    const metrics = await (await fetch(`${gw.url}/metrics`)).text()
    expect(metrics).toContain('modelgate_models_total{status="active"} 1')
    expect(metrics).toMatch(new RegExp(`modelgate_gpu_memory_used_bytes\\{model_id="${id}"\\} \\d+`))
    // The GPU series come from the newest reading, whose age is exposed beside them.
    const age = Number(/^modelgate_gpu_reading_age_seconds (\S+)$/m.exec(metrics)?.[1])
    expect(age).toBeGreaterThanOrEqual(0)
    expect(metrics).toMatch(/^modelgate_gpu_memory_free_bytes\{gpu="1"\} \d+/m)
  })

  it('sleeps at level 1 and 2, freeing GPU memory per level, and wakes', async () => {
    const id = (await gw.json<{ models: { id: string }[] }>('/api/v1/models')).body.models[0]!.id
    const used = async () => (await gpus())[1]!.memory_used_mb
    const awake = await used()

    const s1 = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/sleep?level=1`, {
      method: 'POST',
    })
    expect(s1.status).toBe(200)
    expect(s1.body).toMatchObject({ status: 'sleeping', instance_id: id, sleep_level: 1 })
    const level1 = await used()
    expect(level1 / awake).toBeLessThan(0.15)
    expect(level1 / awake).toBeGreaterThan(0.05)
    const st = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/sleep-status`)
    expect(st.body).toMatchObject({
      status: 'sleeping',
      is_sleeping: true,
      sleep_level: 1,
      engine_is_sleeping: true,
    })

    const w1 = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/wake`, { method: 'POST' })
    expect(w1.status).toBe(200)
    expect(w1.body).toMatchObject({ status: 'running', instance_id: id })
    expect(await used()).toBe(awake)

    await gw.json(`/api/models/instances/${id}/sleep?level=2`, { method: 'POST' })
    const level2 = await used()
    expect(level2).toBeLessThan(level1)
    const part = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/wake`, {
      method: 'POST',
      body: JSON.stringify({ tags: 'weights' }),
    })
    expect(part.body).toMatchObject({ status: 'sleeping', tags: ['weights'] })
    const rest = await gw.json<Record<string, unknown>>(`/api/models/instances/${id}/wake`, {
      method: 'POST',
      body: JSON.stringify({ tags: ['kv_cache'] }),
    })
    expect(rest.body).toMatchObject({ status: 'running' })
    expect(await used()).toBe(awake)
    expect((await gw.waitStatus(id, 'active')).sleep_level).toBeNull()
  })

  it('answers every sleep and wake error code of the spec', async () => {
    const id = (await gw.json<{ models: { id: string }[] }>('/api/v1/models')).body.models[0]!.id
    const wakeAwake = await gw.json<{ error: { code: string; statusCode: number } }>(
      `/api/models/instances/${id}/wake`,
      {
        method: 'POST',
      },
    )
    expect(wakeAwake.status).toBe(409)
    expect(wakeAwake.body.error.statusCode).toBe(409)
    expect((await gw.json(`/api/models/instances/nope/sleep`, { method: 'POST' })).status).toBe(404)
    expect((await gw.json(`/api/models/instances/nope/wake`, { method: 'POST' })).status).toBe(404)
    expect((await gw.json(`/api/models/instances/nope/sleep-status`)).status).toBe(404)
    const badLevel = await gw.json<{ error: { code: string } }>(`/api/models/instances/${id}/sleep?level=3`, {
      method: 'POST',
    })
    expect(badLevel.status).toBe(400)
    await gw.json(`/api/models/instances/${id}/sleep`, { method: 'POST' })
    expect((await gw.json(`/api/models/instances/${id}/sleep`, { method: 'POST' })).status).toBe(409)
    await gw.json(`/api/models/instances/${id}/wake`, { method: 'POST' })

    const plain = await gw.load({
      model_path: 'facebook/opt-125m',
      gpu_ids: [0],
      gpu_memory_utilization: 0.2,
    })
    const startingSleep = await gw.json(`/api/models/instances/${plain}/sleep`, { method: 'POST' })
    expect([400, 409]).toContain(startingSleep.status)
    await gw.waitStatus(plain, 'active')
    const noMode = await gw.json<{ error: { code: string } }>(`/api/models/instances/${plain}/sleep`, {
      method: 'POST',
    })
    expect(noMode.status).toBe(400)
    expect(noMode.body.error.code).toBe('SLEEP_MODE_NOT_ENABLED')
  })

  it('validates load requests', async () => {
    const bad = async (body: Record<string, unknown>) =>
      gw.json<{ error: { code: string; message: string } }>('/api/v1/models/load', {
        method: 'POST',
        body: JSON.stringify(body),
      })
    const missing = await bad({})
    expect(missing.status).toBe(400)
    expect(missing.body.error.code).toBe('VALIDATION_ERROR')
    expect(missing.body.error.message).toContain('model_path')
    const noGpu = await bad({ model_path: 'm-1b', gpu_ids: [7] })
    expect(noGpu.status).toBe(400)
    expect(noGpu.body.error.message).toContain('GPU 7 does not exist')
    const tp = await bad({ model_path: 'm-1b', gpu_ids: [0], tensor_parallel_size: 2 })
    expect(tp.status).toBe(400)
    expect(tp.body.error.message).toContain('tensor_parallel_size')
    const managed = await bad({ model_path: 'm-1b', extra_args: ['--max-model-len', '4096'] })
    expect(managed.status).toBe(400)
    expect(managed.body.error.message).toContain('--max-model-len')
    const full = await bad({ model_path: 'meta-llama/Llama-3.1-8B-Instruct', gpu_ids: [1] })
    expect(full.status).toBe(400)
    expect(full.body.error.code).toBe('INSUFFICIENT_MEMORY')
    expect(full.body.error.message).toMatch(/GPU 1 has [\d.]+ GiB free; the engine needs [\d.]+ GiB/)
    const models = (await gw.json<{ models: { port: number }[] }>('/api/v1/models')).body.models
    const taken = await bad({ model_path: 'm-1b', extra_args: ['--port', String(models[0]!.port)] })
    expect(taken.status).toBe(409)
    expect(taken.body.error.code).toBe('MODEL_ALREADY_EXISTS')
  })

  it('unloads: stopping, then the process group is gone and the instance disappears', async () => {
    const list = (await gw.json<{ models: { id: string; process_id: number }[] }>('/api/v1/models')).body
      .models
    for (const m of list) {
      const res = await gw.json<Record<string, unknown>>(`/api/v1/models/${m.id}/unload`, { method: 'POST' })
      expect(res.status).toBe(202)
      expect(res.body).toMatchObject({ status: 'stopping', instance_id: m.id })
    }
    await waitFor(
      'every instance to be gone',
      async () => (await gw.json<{ total: number }>('/api/v1/models')).body.total === 0,
      { timeoutMs: 15_000, wake: (notify) => gw.host.bus.on('gateway.instance.status', notify) },
    )
    expect((await gw.json<{ total: number }>('/api/v1/models')).body.total).toBe(0)
    for (const m of list) expect(groupGone(m.process_id)).toBe(true)
    expect((await gw.json(`/api/v1/models/${list[0]!.id}`)).status).toBe(404)
    expect((await gpus()).map((g) => g.models_loaded)).toEqual([0, 0])
  })

  it('marks a crashed engine failed with its last error lines and frees its port', async () => {
    const id = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [0], gpu_memory_utilization: 0.2 })
    const model = await gw.waitStatus(id, 'active')
    process.kill(model.process_id as number, 'SIGKILL')
    const failed = await gw.waitStatus(id, 'failed')
    expect(failed.error).toContain('engine exited unexpectedly')
    await waitFor(`engine group ${model.process_id} to be gone`, () => groupGone(model.process_id as number))
    expect(groupGone(model.process_id as number)).toBe(true)
    const again = await gw.load({
      model_path: 'facebook/opt-125m',
      gpu_ids: [0],
      gpu_memory_utilization: 0.2,
      extra_args: ['--port', String(model.port)],
    })
    await gw.waitStatus(again, 'active')
    await gw.json(`/api/v1/models/${again}/unload`, { method: 'POST' })
    await gw.json(`/api/v1/models/${id}/unload`, { method: 'POST' })
  })

  it('documents every gateway route in /docs/json with the admin scheme', async () => {
    const doc = (
      await gw.json<{ paths: Record<string, Record<string, { tags: string[]; security?: unknown }>> }>(
        '/docs/json',
      )
    ).body
    for (const p of [
      '/api/v1/models/load',
      '/api/v1/models',
      '/api/v1/models/{id}',
      '/api/v1/models/{id}/unload',
      '/api/v1/models/instances/{instance_id}/events',
      '/api/v1/models/instances/{instance_id}/logs',
      '/api/gpu/available',
      '/api/memory/usage',
      '/api/memory/usage/multi-gpu',
      '/api/models/instances/{instance_id}/sleep',
      '/api/models/instances/{instance_id}/wake',
      '/api/models/instances/{instance_id}/sleep-status',
    ]) {
      const ops = doc.paths[p]
      expect(ops).toBeDefined()
      for (const op of Object.values(ops!)) {
        expect(op.tags).toEqual(['gateway'])
        expect(op.security).toEqual([{ adminJwt: [] }])
      }
    }
  })
})
