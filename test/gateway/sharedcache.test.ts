import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { plugins } from '../../plugins/index.ts'
import { knownPlugins } from '../../src/config/file.ts'
import { type ConfigError, loadConfig } from '../../src/config/load.ts'
import { instanceSegmentName, readKvcachedSegment, writeKvcachedSegment } from '../../src/gpu/kvcached.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

const GIB = 2 ** 30
const PREALLOC = 2 * GIB // the simulated kvcached's prealloc per engine

type Kv = Record<string, number>

/**
 * kvcached keeps one segment per engine instance: each shared-cache engine is launched with its
 * own KVCACHED_IPC_NAME, the pool of a GPU is the sum of its engines' segments, a killed engine's
 * stale segment is removed, and placement is the only memory guard for shared-cache engines.
 */
describe('shared KV cache (kvcached): one segment per engine', () => {
  const shm = mkdtempSync(join(tmpdir(), 'modelgate-shm-'))
  let gw: TestGateway
  let a = ''
  let b = ''
  beforeAll(async () => {
    gw = await startGateway({
      ports: [18160, 18169],
      shmDir: shm,
      extraYaml: '    sharedcache: { enabled: true }\n',
    })
  })
  afterAll(async () => {
    await gw.stop()
    rmSync(shm, { recursive: true, force: true })
  })

  const segment = (id: string) => readKvcachedSegment(instanceSegmentName(id), shm)
  /** A TP 2 engine on GPUs 0 and 1: never a shared-cache engine. */
  const loadAcrossBothGpus = (util: number) =>
    gw.load({
      model_path: 'facebook/opt-125m',
      gpu_ids: [0, 1],
      tensor_parallel_size: 2,
      gpu_memory_utilization: util,
    })

  it("gives each engine its own segment; the second's start leaves the first's figures alone", async () => {
    a = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [0] })
    const ma = await gw.waitStatus(a, 'active')
    expect(ma.sharedcache_enabled).toBe(true)
    expect(ma.launch_command).not.toContain('--gpu-memory-utilization')
    // The engine's start wrote (its_total, 0, 0), then its prealloc.
    const started = segment(a)
    expect(started).toMatchObject({ usedBytes: 0, preallocBytes: PREALLOC })
    expect(started!.totalBytes).toBeGreaterThan(0)
    // Figures as kvcached would publish them while A serves.
    const figuresA = { totalBytes: 60 * GIB, usedBytes: 3 * GIB, preallocBytes: PREALLOC }
    writeKvcachedSegment(instanceSegmentName(a), figuresA, shm)

    b = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [0] })
    await gw.waitStatus(b, 'active')
    expect(segment(b)).toMatchObject({ usedBytes: 0, preallocBytes: PREALLOC })
    expect(segment(a)).toEqual(figuresA)
    expect(readdirSync(shm).sort()).toEqual([instanceSegmentName(a), instanceSegmentName(b)].sort())
  })

  it('shows the sum of the engines’ segments as the GPU’s pool (views and metrics)', async () => {
    writeKvcachedSegment(
      instanceSegmentName(b),
      { totalBytes: 50 * GIB, usedBytes: 1 * GIB, preallocBytes: PREALLOC },
      shm,
    )
    const single = await gw.json<{ kvcache: Kv; gpu: Kv }>('/api/memory/usage')
    expect(single.body.kvcache).toMatchObject({ used_gb: 4, prealloc_gb: 4 })
    expect(single.body.kvcache.free_gb!).toBeCloseTo(single.body.kvcache.total_gb! - 8, 1)
    const multi = await gw.json<{ gpus: { gpu_index: number; kvcache?: Kv }[] }>(
      '/api/memory/usage/multi-gpu',
    )
    expect(multi.body.gpus[0]!.kvcache).toMatchObject({ used_gb: 4, prealloc_gb: 4 })
    expect(multi.body.gpus[1]!.kvcache).toBeUndefined()

    const metrics = await (await fetch(`${gw.url}/metrics`)).text()
    expect(metrics).toContain(`modelgate_kv_pool_used_bytes{gpu="0"} ${4 * GIB}`)
    expect(metrics).toContain(`modelgate_kv_pool_prealloc_bytes{gpu="0"} ${4 * GIB}`)
    expect(metrics).toContain(`modelgate_kv_pool_limit_bytes{gpu="0"} ${110 * GIB}`)
    expect(metrics).not.toContain('modelgate_kv_pool_used_bytes{gpu="1"}')
  })

  it("removes a killed engine's stale segment and keeps the other engine's", async () => {
    const figuresA = segment(a)
    const rec = await gw.json<{ model: { process_id: number } }>(`/api/v1/models/${b}`)
    process.kill(-rec.body.model.process_id, 'SIGKILL') // no exit handler runs: the segment stays behind
    await gw.waitStatus(b, 'failed')
    await waitFor(`the stale segment of ${b} to be removed`, () => segment(b) === null, {
      timeoutMs: 15_000,
    })
    expect(segment(a)).toEqual(figuresA)
    await unload(gw, b)

    // A clean exit: the engine removes its own segment.
    await unload(gw, a)
    expect(existsSync(join(shm, instanceSegmentName(a)))).toBe(false)
    const metrics = await (await fetch(`${gw.url}/metrics`)).text()
    expect(metrics).not.toContain('modelgate_kv_pool_used_bytes{gpu="0"}')
  })

  it('refuses a shared-cache load that would over-commit the GPU, before spawning anything', async () => {
    // A TP engine (no shared cache) takes 95% of both GPUs: ~4 GiB stay free on each, less than
    // kvcached's own 5% reserve (~4 GiB) plus the KV cache a new engine must map at start.
    const big = await loadAcrossBothGpus(0.95)
    await gw.waitStatus(big, 'active')
    const before = (await gw.json<{ total: number }>('/api/v1/models')).body.total
    for (const body of [
      { model_path: 'Qwen/Qwen2.5-0.5B-Instruct', gpu_ids: [0] },
      { model_path: 'Qwen/Qwen2.5-0.5B-Instruct' },
    ]) {
      const r = await gw.json<{ error: { code: string; message: string } }>('/api/v1/models/load', {
        method: 'POST',
        body: JSON.stringify(body),
      })
      expect(r.status).toBe(400)
      expect(r.body.error.code).toBe('INSUFFICIENT_MEMORY')
      expect(r.body.error.message).toContain("kvcached's reserve")
    }
    expect((await gw.json<{ total: number }>('/api/v1/models')).body.total).toBe(before)
    expect(readdirSync(shm)).toEqual([])
    await unload(gw, big)
  })

  it('does not use the shared cache with tensor parallelism', async () => {
    const id = await loadAcrossBothGpus(0.3)
    const m = await gw.waitStatus(id, 'active')
    expect(m.sharedcache_enabled).toBe(false)
    expect(m.launch_command).toContain('--gpu-memory-utilization 0.3')
    expect(Object.keys(m.memory_baseline_by_gpu as object)).toEqual(['0', '1'])
    expect(readdirSync(shm)).toEqual([])
    await unload(gw, id)
  })
})

async function unload(gw: TestGateway, id: string) {
  await gw.json(`/api/v1/models/${id}/unload`, { method: 'POST' })
  await waitFor(
    `instance ${id} to be gone`,
    async () => (await gw.json(`/api/v1/models/${id}`)).status === 404,
    {
      timeoutMs: 15_000,
      wake: (notify) => gw.host.bus.on('gateway.instance.status', notify),
    },
  )
}

/**
 * kvcached has its segment directory fixed at /dev/shm: a configured shm_dir anywhere else could only
 * make the pool view look in the wrong place, so it is refused before anything starts.
 */
describe('sharedcache.shm_dir', () => {
  const yaml = (dir: string) =>
    `plugins:\n  gateway:\n    sharedcache: { enabled: true, shm_dir: '${dir}' }\n`
  const REFUSAL =
    'plugins.gateway.sharedcache.shm_dir: must be /dev/shm: kvcached always writes its segments there ' +
    '(it has no setting for another directory), so the pool view would never find them in any other'

  it('accepts /dev/shm, the default, and refuses any other directory with the reason', () => {
    const known = knownPlugins(plugins)
    const ok = loadConfig(yaml('/dev/shm'), {}, known).plugins.get('gateway') as {
      sharedcache: { shm_dir: string }
    }
    expect(ok.sharedcache.shm_dir).toBe('/dev/shm')
    const defaulted = loadConfig('plugins:\n  gateway: {}\n', {}, known).plugins.get('gateway') as {
      sharedcache: { shm_dir: string }
    }
    expect(defaulted.sharedcache.shm_dir).toBe('/dev/shm')
    let problems: string[] = []
    try {
      loadConfig(yaml('/mnt/shm'), {}, known)
    } catch (err) {
      problems = (err as ConfigError).problems
    }
    expect(problems).toEqual([REFUSAL])
  })

  it('makes check-config exit 2 naming it', () => {
    const dir = mkdtempSync(join(tmpdir(), 'modelgate-shm-config-'))
    try {
      const file = join(dir, 'modelgate.yaml')
      writeFileSync(file, yaml('/tmp/kv'))
      const main = resolve(import.meta.dir, '../../src/main.ts')
      const run = Bun.spawnSync([process.execPath, main, 'check-config', '--config', file], {
        env: { PATH: process.env.PATH ?? '' },
      })
      expect(run.exitCode).toBe(2)
      expect(run.stderr.toString()).toContain(`  ${REFUSAL}\n`)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
