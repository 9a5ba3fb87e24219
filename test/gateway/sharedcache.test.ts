import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { readKvcachedSegment, writeKvcachedSegment } from '../../src/gpu/kvcached.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

const GIB = 2 ** 30

describe('shared KV cache (kvcached) accounting', () => {
  const shm = mkdtempSync(join(tmpdir(), 'modelgate-shm-'))
  let gw: TestGateway
  beforeAll(async () => {
    gw = await startGateway({
      ports: [18160, 18169],
      env: { MODELGATE_SHM_DIR: shm },
      extraYaml: `    sharedcache: { enabled: true, shm_dir: '${shm}' }\n`,
    })
  })
  afterAll(async () => {
    await gw.stop()
    rmSync(shm, { recursive: true, force: true })
  })

  it('launches TP=1 engines on one pool per GPU and reads used/prealloc from its segment', async () => {
    const a = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [0] })
    const b = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [0] })
    const ma = await gw.waitStatus(a, 'active')
    await gw.waitStatus(b, 'active')
    expect(ma.sharedcache_enabled).toBe(true)
    expect(ma.launch_command).not.toContain('--gpu-memory-utilization')
    expect(existsSync(join(shm, 'modelgate_GPU0'))).toBe(true)

    // Our own figures in the segment, as kvcached would publish them.
    writeKvcachedSegment(
      'modelgate_GPU0',
      { totalBytes: 60 * GIB, usedBytes: 3 * GIB, preallocBytes: 4 * GIB },
      shm,
    )
    const single = await gw.json<{ kvcache: Record<string, number> }>('/api/memory/usage')
    expect(single.body.kvcache.used_gb).toBe(3)
    expect(single.body.kvcache.prealloc_gb).toBe(4)
    const gpu = await gw.json<{ gpu: { free_gb: number } }>('/api/memory/usage')
    expect(single.body.kvcache.total_gb!).toBeCloseTo(gpu.body.gpu.free_gb + 7, 1)
    expect(single.body.kvcache.free_gb!).toBeCloseTo(single.body.kvcache.total_gb! - 7, 1)
    const multi = await gw.json<{ gpus: { gpu_index: number; kvcache?: Record<string, number> }[] }>(
      '/api/memory/usage/multi-gpu',
    )
    expect(multi.body.gpus[0]!.kvcache).toMatchObject({ used_gb: 3, prealloc_gb: 4 })
    expect(multi.body.gpus[1]!.kvcache).toBeUndefined()

    // Unloading one engine (which removes the segment on SIGTERM) keeps the pool for the other.
    await gw.json(`/api/v1/models/${a}/unload`, { method: 'POST' })
    await waitGone(gw, a)
    expect(readKvcachedSegment('modelgate_GPU0', shm)).not.toBeNull()
    await gw.json(`/api/v1/models/${b}/unload`, { method: 'POST' })
    await waitGone(gw, b)
    expect(readKvcachedSegment('modelgate_GPU0', shm)).toBeNull()
  })

  it('does not use the shared cache with tensor parallelism', async () => {
    const id = await gw.load({
      model_path: 'facebook/opt-125m',
      gpu_ids: [0, 1],
      tensor_parallel_size: 2,
      gpu_memory_utilization: 0.3,
    })
    const m = await gw.waitStatus(id, 'active')
    expect(m.sharedcache_enabled).toBe(false)
    expect(m.launch_command).toContain('--gpu-memory-utilization 0.3')
    expect(Object.keys(m.memory_baseline_by_gpu as object)).toEqual(['0', '1'])
    await gw.json(`/api/v1/models/${id}/unload`, { method: 'POST' })
    await waitGone(gw, id)
  })
})

async function waitGone(gw: TestGateway, id: string) {
  await waitFor(
    `instance ${id} to be gone`,
    async () => (await gw.json(`/api/v1/models/${id}`)).status === 404,
    {
      timeoutMs: 15_000,
      wake: (notify) => gw.host.bus.on('gateway.instance.status', notify),
    },
  )
}
