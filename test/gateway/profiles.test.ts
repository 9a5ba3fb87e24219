import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { CheckResult } from '../../plugins/gateway/profiles/check.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

type Profile = Record<string, unknown> & { id: string; source: string; created_at: string }
type Check = CheckResult
type Err = { error: { code: string; message: string; statusCode: number } }

const H100 = 'NVIDIA H100 80GB HBM3'
const OPT = 'facebook/opt-125m'

describe('memory profiles and the pre-load check', () => {
  let gw: TestGateway
  const post = <T>(path: string, body: unknown) =>
    gw.json<T>(path, { method: 'POST', body: JSON.stringify(body) })
  const profiles = async () =>
    (await gw.json<{ profiles: Profile[]; total: number }>('/api/memory/profiles')).body
  const check = (body: Record<string, unknown>) => post<Check>('/api/memory/profiles/check', body)
  const manual = (over: Record<string, unknown>) =>
    post<{ profile: Profile }>('/api/memory/profiles', {
      profileName: 'typed in',
      modelPath: 'acme/check-model',
      maxTokens: 4096,
      totalGpuMemoryGib: 30,
      weightsMemoryGib: 10,
      cudaGraphsGib: 1,
      gpuName: H100,
      gpuTotalMemoryGib: 79.65,
      ...over,
    })
  const waitAuto = (pred: (p: Profile) => boolean) =>
    waitFor(
      `an auto profile where ${pred}`,
      async () => (await profiles()).profiles.find((p) => p.source === 'auto' && pred(p)),
      { wake: (notify) => gw.host.bus.on('gateway.instance.status', notify) },
    )
  let first: string
  let second: string

  beforeAll(async () => {
    gw = await startGateway({ ports: [18220, 18239] })
  })
  afterAll(() => gw.stop())

  it('records one auto profile per key when loads become ready, newest measurement kept', async () => {
    first = await gw.load({ model_path: OPT, gpu_ids: [0], gpu_memory_utilization: 0.25 })
    const model = await gw.waitStatus(first, 'active')
    const mm = model.memory_metrics as Record<string, number>
    const auto = await waitAuto((p) => p.model_path === OPT)
    expect(auto).toMatchObject({
      model_path: OPT,
      max_tokens: 2048,
      gpu_name: H100,
      tensor_parallel_size: 1,
      gpu_memory_utilization: 0.25,
      total_gpu_memory_gib: mm.total_gpu_memory_gib,
      weights_memory_gib: mm.weights_memory_gib,
      cuda_graphs_gib: mm.cuda_graph_memory_gib,
      overhead_memory_gib: mm.overhead_memory_gib,
      kv_cache_available_gib: mm.kv_cache_available_gib,
    })
    expect(auto.gpu_total_memory_gib as number).toBeCloseTo(81559 / 1024, 3)

    second = await gw.load({ model_path: OPT, gpu_ids: [1], gpu_memory_utilization: 0.25 })
    await gw.waitStatus(second, 'active')
    const again = await waitAuto((p) => p.created_at > auto.created_at)
    expect(again.id).toBe(auto.id)
    expect((await profiles()).profiles.filter((p) => p.source === 'auto')).toHaveLength(1)
  })

  it('looks a profile up by exact key, 404 PROFILE_NOT_FOUND otherwise', async () => {
    const q = (max: number, gpu = H100) =>
      gw.json<{ profile: Profile } & Err>(
        `/api/memory/profiles/lookup?model_path=${encodeURIComponent(OPT)}&max_tokens=${max}&gpu_name=${encodeURIComponent(gpu)}`,
      )
    const hit = await q(2048)
    expect(hit.status).toBe(200)
    expect(hit.body.profile).toMatchObject({ model_path: OPT, max_tokens: 2048, source: 'auto' })
    for (const miss of [await q(4096), await q(2048, 'NVIDIA L4')]) {
      expect(miss.status).toBe(404)
      expect(miss.body.error.code).toBe('PROFILE_NOT_FOUND')
    }
    expect((await gw.json('/api/memory/profiles/lookup?model_path=x')).status).toBe(400)
  })

  it('creates profiles from a running instance and manually, validating the figures', async () => {
    const fromInstance = await post<{ profile: Profile } & Err>('/api/memory/profiles', {
      instanceId: first,
      profileName: 'opt on gpu 0',
      comments: 'baseline',
    })
    expect(fromInstance.status).toBe(201)
    expect(fromInstance.body.profile).toMatchObject({
      source: 'instance',
      profile_name: 'opt on gpu 0',
      comments: 'baseline',
      gpu_name: H100,
    })
    const unknown = await post<Err>('/api/memory/profiles', { instanceId: 'nope', profileName: 'x' })
    expect([unknown.status, unknown.body.error.code]).toEqual([404, 'MODEL_NOT_FOUND'])

    const bad = async (over: Record<string, unknown>, re: RegExp) => {
      const r = await manual(over)
      expect(r.status).toBe(400)
      expect((r.body as unknown as Err).error).toMatchObject({ code: 'VALIDATION_ERROR' })
      expect((r.body as unknown as Err).error.message).toMatch(re)
    }
    await bad({ modelPath: undefined, gpuName: undefined }, /body\.modelPath: is required.*gpuName/)
    await bad({ weightsMemoryGib: 40 }, /at least weightsMemoryGib \+ cudaGraphsGib/)
    await bad({ totalGpuMemoryGib: 90 }, /must not exceed gpuTotalMemoryGib/)
    await bad({ overheadMemoryGib: 5, kvCacheAvailableGib: 1 }, /must equal totalGpuMemoryGib/)
    await bad({ maxTokens: 0 }, /body\.maxTokens/)
    await bad({ instanceId: first }, /not both/)
    await bad({ profileName: undefined }, /body\.profileName/)

    const derived = await manual({ profileName: 'derived' })
    expect(derived.status).toBe(201)
    expect(derived.body.profile).toMatchObject({
      source: 'manual',
      overhead_memory_gib: 0,
      kv_cache_available_gib: 19,
      tensor_parallel_size: 1,
      gpu_memory_utilization: null,
    })
    const split = await manual({ maxTokens: 1, overheadMemoryGib: 2 })
    expect(split.body.profile).toMatchObject({ overhead_memory_gib: 2, kv_cache_available_gib: 17 })
  })

  it('grades the pre-load check info, ok, caution and danger against free memory', async () => {
    // No profile: the engine's claim at start (utilization × the GPU), as the load's placement counts
    // it. Here that is more than GPU 0 has free, so the check says danger, as the load would refuse.
    const free = (await check({ model_path: 'acme/unknown', gpu_ids: [0] })).body
    expect(free).toMatchObject({
      warning_level: 'danger',
      profile_found: false,
      gpu_name: H100,
      gpu_ids: [0],
    })
    expect(free.estimated_memory_gib).toBeCloseTo(0.9 * free.gpu_total_memory_gib!, 2)
    const avail = free.available_memory_gib!
    expect(avail).toBeGreaterThan(55)
    expect(avail).toBeLessThan(65)

    await manual({ maxTokens: 8192, totalGpuMemoryGib: Math.round(avail * 0.95) })
    await manual({ maxTokens: 16384, totalGpuMemoryGib: Math.round(avail + 5) })
    const level = async (max: number) =>
      (await check({ model_path: 'acme/check-model', max_tokens: max, gpu_ids: [0] })).body
    const ok = await level(4096)
    expect(ok).toMatchObject({ warning_level: 'ok', profile_found: true, estimated_memory_gib: 30 })
    expect(ok.available_memory_gib).toBeCloseTo(avail, 1)
    expect(ok.message).toContain('30.0 GiB')
    expect((await level(8192)).warning_level).toBe('caution')
    const danger = await level(16384)
    expect(danger.warning_level).toBe('danger')
    expect(danger.message).toMatch(/only \d+\.\d GiB is free on GPU 0/)
    // Without max_tokens the largest profile (the model's default context) is the estimate.
    expect((await check({ model_path: 'acme/check-model', gpu_ids: [0] })).body.warning_level).toBe('danger')

    // gpu_name: the best GPU of that name here; a kind absent from this host is an empty GPU of it.
    expect(
      (await check({ model_path: 'acme/check-model', max_tokens: 4096, gpu_name: H100 })).body,
    ).toMatchObject({ warning_level: 'ok', gpu_name: H100 })
    await manual({ gpuName: 'NVIDIA A100-SXM4-40GB', gpuTotalMemoryGib: 40, totalGpuMemoryGib: 36 })
    const a100 = (
      await check({ model_path: 'acme/check-model', max_tokens: 4096, gpu_name: 'NVIDIA A100-SXM4-40GB' })
    ).body
    expect(a100).toMatchObject({ warning_level: 'caution', available_memory_gib: 40, gpu_ids: [] })
    expect(a100.message).toContain('none on this host')

    // An auto profile (recorded at 0.25) re-sizes to the utilization asked for.
    const opt = async (u: number) =>
      (await check({ model_path: OPT, max_tokens: 2048, gpu_ids: [0], gpu_memory_utilization: u })).body
    expect((await opt(0.25)).warning_level).toBe('ok')
    const big = await opt(0.9)
    expect(big.warning_level).toBe('danger')
    expect(big.estimated_memory_gib).toBeCloseTo(0.9 * (81559 / 1024), 1)
    expect((await opt(0.01)).message).toContain('no room for the KV cache')

    const both = await check({ model_path: OPT, gpu_ids: [0], gpu_name: H100 })
    expect(both.status).toBe(400)
    expect((await check({ model_path: OPT, gpu_ids: [7] })).status).toBe(400)
  })

  // Needs the gateway's pre-load hook wired (service.preloadCheck) and `force` in the load body.
  it('refuses a load the profile says will not fit, unless forced', async () => {
    const avail = (await check({ model_path: 'acme/unknown', gpu_ids: [1] })).body.available_memory_gib!
    await manual({ modelPath: OPT, maxTokens: 1024, totalGpuMemoryGib: Math.round(avail + 5) })
    const body = { model_path: OPT, max_tokens: 1024, gpu_ids: [1], gpu_memory_utilization: 0.2 }
    const refused = await post<Err>('/api/v1/models/load', body)
    expect(refused.status).toBe(400)
    expect(refused.body.error.code).toBe('INSUFFICIENT_MEMORY')
    expect(refused.body.error.message).toMatch(/needs about \d+\.\d GiB per GPU.*force/)
    const forced = await post<{ instance_id: string }>('/api/v1/models/load', { ...body, force: true })
    expect(forced.status).toBe(202)
    await gw.waitStatus(forced.body.instance_id, 'active')
    await waitAuto((p) => p.model_path === OPT && p.max_tokens === 1024)
  })

  it('round-trips profiles through an export bundle, skipping what exists and keeping the newest', async () => {
    const bundle = (
      await gw.json<{ format: string; version: number; profiles: Profile[] }>('/api/memory/profiles/export')
    ).body
    expect(bundle).toMatchObject({ format: 'modelgate.memory-profiles', version: 1 })
    const n = bundle.profiles.length
    expect(n).toBe((await profiles()).total)
    const same = await post<{ imported: number; skipped: number }>('/api/memory/profiles/import', bundle)
    expect(same.body).toEqual({ imported: 0, skipped: n })

    const victim = bundle.profiles.find((p) => p.profile_name === 'derived')!
    const del = await gw.json(`/api/memory/profiles/${victim.id}`, { method: 'DELETE' })
    expect(del.body).toEqual({ deleted: true, id: victim.id })
    expect((await gw.json<Err>(`/api/memory/profiles/${victim.id}`, { method: 'DELETE' })).status).toBe(404)

    const auto = bundle.profiles.find((p) => p.source === 'auto' && p.max_tokens === 2048)!
    const newer = { ...auto, id: 'from-pod-b', created_at: new Date(Date.now() + 60_000).toISOString() }
    const older = { ...auto, id: 'stale-pod-c', created_at: '2000-01-01T00:00:00.000Z' }
    const merged = await post<{ imported: number; skipped: number }>('/api/memory/profiles/import', {
      ...bundle,
      profiles: [...bundle.profiles, newer, older],
    })
    expect(merged.body).toEqual({ imported: 2, skipped: n })
    const after = (await profiles()).profiles
    expect(after.map((p) => p.id)).toContain(victim.id)
    expect(after.map((p) => p.id)).toContain('from-pod-b')
    expect(after.map((p) => p.id)).not.toContain(auto.id)
    expect(after.map((p) => p.id)).not.toContain('stale-pod-c')

    const v2 = await post<Err>('/api/memory/profiles/import', { ...bundle, version: 2 })
    expect([v2.status, v2.body.error.code]).toEqual([400, 'UNSUPPORTED_BUNDLE_VERSION'])
    expect((await post('/api/memory/profiles/import', { ...bundle, format: 'other' })).status).toBe(400)
  })
})
