import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { PresetProgressEvent } from '../../plugins/gateway/presets/service.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { readSse } from '../support/sse.ts'

type Model = Record<string, unknown> & {
  id: string
  status: string
  gpu_ids: number[]
  loaded_at: string
  ready_at: string | null
}
type Err = { error: { code: string; message: string; statusCode: number } }
type Entry = Record<string, unknown> & { modelPath: string; gpuIds: number[]; loadOrder: number }

const OPT = 'facebook/opt-125m'

describe('configuration presets', () => {
  let gw: TestGateway
  const post = <T>(path: string, body?: unknown) =>
    gw.json<T>(path, { method: 'POST', ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
  const models = async () => (await gw.json<{ models: Model[] }>('/api/v1/models')).body.models
  let pairId: string
  let stackId: string
  let sleeper: string

  beforeAll(async () => {
    gw = await startGateway({ ports: [18200, 18219] })
  })
  afterAll(() => gw.stop())

  it('saves the running models, sleeping ones included, with extra_args and sleep mode', async () => {
    sleeper = await gw.load({
      model_path: OPT,
      gpu_ids: [0],
      gpu_memory_utilization: 0.25,
      enable_sleep_mode: true,
      extra_args: ['--enforce-eager'],
    })
    const other = await gw.load({
      model_path: OPT,
      gpu_ids: [1],
      gpu_memory_utilization: 0.25,
      served_model_name: 'opt-b',
      max_tokens: 1024,
    })
    await Promise.all([gw.waitStatus(sleeper, 'active'), gw.waitStatus(other, 'active')])
    expect((await post(`/api/models/instances/${sleeper}/sleep?level=1`)).status).toBe(200)

    const saved = await post<{ configuration: Record<string, unknown> }>('/api/configurations', {
      name: 'pair',
      description: 'two small models',
    })
    expect(saved.status).toBe(201)
    expect(saved.body.configuration).toMatchObject({ name: 'pair', modelCount: 2 })
    pairId = saved.body.configuration.id as string

    const detail = await gw.json<{ configuration: Record<string, unknown> & { entries: Entry[] } }>(
      `/api/configurations/${pairId}`,
    )
    expect(detail.body.configuration).toMatchObject({
      name: 'pair',
      description: 'two small models',
      modelCount: 2,
    })
    expect(detail.body.configuration.entries).toMatchObject([
      {
        modelPath: OPT,
        servedModelName: OPT,
        maxTokens: 2048,
        sourceType: 'huggingface',
        gpuIds: [0],
        tensorParallelSize: 1,
        extraArgs: ['--enforce-eager'],
        enableSleepMode: true,
        gpuMemoryUtilization: 0.25,
        loadOrder: 0,
        engineKind: 'vllm',
      },
      {
        servedModelName: 'opt-b',
        maxTokens: 1024,
        gpuIds: [1],
        extraArgs: [],
        enableSleepMode: false,
        loadOrder: 1,
        engineKind: 'vllm',
      },
    ])
  })

  it('refuses a duplicate name (409), a missing or blank name (400) and unknown ids (404)', async () => {
    for (const name of ['pair', 'PAIR']) {
      const dup = await post<Err>('/api/configurations', { name })
      expect([dup.status, dup.body.error.code]).toEqual([409, 'CONFIGURATION_EXISTS'])
    }
    for (const body of [{}, { name: '' }, { name: '   ' }]) {
      const bad = await post<Err>('/api/configurations', body)
      expect([bad.status, bad.body.error.code]).toEqual([400, 'VALIDATION_ERROR'])
      expect(bad.body.error.message).toContain('body.name')
    }
    for (const [method, path] of [
      ['GET', '/api/configurations/nope'],
      ['DELETE', '/api/configurations/nope'],
      ['POST', '/api/configurations/nope/load'],
    ] as const) {
      const r = await gw.json<Err>(path, { method })
      expect([r.status, r.body.error.code]).toEqual([404, 'CONFIGURATION_NOT_FOUND'])
    }
  })

  it('loads a preset: unloads everything, then one after another on a shared GPU and in parallel across GPUs', async () => {
    const third = await gw.load({
      model_path: OPT,
      gpu_ids: [0],
      gpu_memory_utilization: 0.25,
      served_model_name: 'opt-c',
    })
    await gw.waitStatus(third, 'active')
    const saved = await post<{ configuration: { id: string; modelCount: number } }>('/api/configurations', {
      name: 'stack',
    })
    expect(saved.body.configuration.modelCount).toBe(3)
    stackId = saved.body.configuration.id
    const before = (await models()).map((m) => m.id)

    const events: PresetProgressEvent[] = []
    const off = gw.host.bus.on('gateway.preset.progress', (e) => events.push(e))
    const stream = await fetch(`${gw.url}/api/configurations/events`)
    const started = await post<Record<string, unknown>>(`/api/configurations/${stackId}/load`)
    expect(started.status).toBe(202)
    expect(started.body).toEqual({ status: 'started', configId: stackId, configName: 'stack', modelCount: 3 })
    const busy = await post<Err>(`/api/configurations/${pairId}/load`)
    expect([busy.status, busy.body.error.code]).toEqual([409, 'CONFIGURATION_LOAD_IN_PROGRESS'])

    const sse = await readSse(stream, `preset ${stackId} to complete or fail`, (evs) =>
      evs.some((e) => ['completed', 'failed'].includes((e.data as PresetProgressEvent).phase)),
    )
    off()
    const last = events.at(-1)!
    expect(last).toMatchObject({ configId: stackId, phase: 'completed', loaded: 3, failed: 0, total: 3 })
    expect(events[0]!.phase).toBe('unloading')
    expect(sse.map((e) => e.event)).toContain('preset_progress')
    expect((sse.at(-1)!.data as PresetProgressEvent).phase).toBe('completed')
    // A client that connects after the load first gets where it ended (the replayed latest event).
    const late = await readSse(
      await fetch(`${gw.url}/api/configurations/events`),
      'the replay of the latest preset event',
      (evs) => evs.length >= 1,
    )
    expect(late[0]).toEqual({ event: 'preset_progress', data: last })

    const now = await models()
    expect(now).toHaveLength(3)
    expect(now.every((m) => m.status === 'active' && !before.includes(m.id))).toBe(true)
    const byName = (n: string) => now.find((m) => m.served_model_name === n)!
    const [first, gpu1, second] = [byName(OPT), byName('opt-b'), byName('opt-c')]
    expect(first).toMatchObject({ gpu_ids: [0], enable_sleep_mode: true, extra_args: ['--enforce-eager'] })
    expect(gpu1).toMatchObject({ gpu_ids: [1], max_tokens: 1024 })
    expect(second.gpu_ids).toEqual([0])
    // Same GPU: the second starts only once the first is active.
    expect(second.loaded_at >= first.ready_at!).toBe(true)
    // Disjoint GPUs: the start windows overlap.
    expect(gpu1.loaded_at < first.ready_at!).toBe(true)
    expect(first.loaded_at < gpu1.ready_at!).toBe(true)
  })

  it('deletes a configuration without touching running models', async () => {
    const del = await gw.json(`/api/configurations/${pairId}`, { method: 'DELETE' })
    expect([del.status, del.body]).toEqual([200, { deleted: true, id: pairId }])
    expect((await gw.json(`/api/configurations/${pairId}`)).status).toBe(404)
    const list = await gw.json<{ configurations: { id: string }[]; total: number }>('/api/configurations')
    expect(list.body.total).toBe(1)
    expect(list.body.configurations.map((c) => c.id)).toEqual([stackId])
    expect(await models()).toHaveLength(3)
  })
})
