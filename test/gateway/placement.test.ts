import { describe, expect, it } from 'bun:test'
import type { InstanceRow } from '../../plugins/gateway/db/schema.ts'
import {
  placeOnGpus,
  SHARED_CACHE_MIN_KV_MIB,
  sharedCacheEstimate,
  sharedCacheNeed,
  startingClaimMib,
} from '../../plugins/gateway/placement.ts'
import type { GpuInfo } from '../../src/gpu/smi.ts'

/**
 * Placement of shared-cache (kvcached) engines: kvcached disables vLLM's start-up memory check, so
 * the gateway refuses a load unless the GPU has the engine's non-KV part, KV for one request and
 * kvcached's 5% reserve free.
 */
const TOTAL = 80 * 1024

function gpu(index: number, freeMib: number): GpuInfo {
  return {
    index,
    uuid: `GPU-${index}`,
    name: 'NVIDIA H100 80GB HBM3',
    memoryTotalMib: TOTAL,
    memoryUsedMib: TOTAL - freeMib,
    memoryFreeMib: freeMib,
    utilizationPercent: 0,
    temperatureC: 30,
  }
}

function row(over: Partial<InstanceRow>): InstanceRow {
  return {
    model_path: 'Qwen/Qwen2.5-7B-Instruct',
    tensor_parallel_size: 1,
    sharedcache_enabled: true,
    gpu_memory_utilization: 0.9,
    memory_metrics: null,
    ...over,
  } as InstanceRow
}

const metrics = (totalGib: number, kvGib: number, perRequestMib: number, maxLen: number) => ({
  total_gpu_memory_gib: totalGib,
  weights_memory_gib: 0,
  cuda_graph_memory_gib: 0,
  overhead_memory_gib: 0,
  kv_cache_available_gib: kvGib,
  kv_cache_per_request_mib: perRequestMib,
  max_model_len: maxLen,
})

const shared = {
  tensorParallelSize: 1,
  gpuMemoryUtilization: 0.9,
  sharedCache: true,
  pendingMibByGpu: new Map(),
}
const reserve = 4096 // 5% of 80 GiB

describe('shared-cache placement', () => {
  it('needs the measured non-KV part, KV for one request and kvcached’s reserve', () => {
    const est = { nonKvMib: 16 * 1024, requestKvMib: 2 * 1024 }
    expect(sharedCacheNeed(TOTAL, est).needMib).toBe(16 * 1024 + 2 * 1024 + reserve)
    // Never less KV than kvcached's first reserved pages.
    expect(sharedCacheNeed(TOTAL, { nonKvMib: 0, requestKvMib: 10 }).needMib).toBe(
      SHARED_CACHE_MIN_KV_MIB + reserve,
    )
    expect(sharedCacheNeed(TOTAL, null).needMib).toBe(SHARED_CACHE_MIN_KV_MIB + reserve)
    expect(sharedCacheNeed(TOTAL, null).why).toContain('not known yet')
  })

  it('refuses an over-commit with the figures and places what fits', () => {
    const est = { nonKvMib: 16 * 1024, requestKvMib: 1024 }
    const need = 17 * 1024 + reserve
    expect(() =>
      placeOnGpus([gpu(0, need - 100)], { ...shared, gpuIds: [0], sharedCacheEstimate: est }),
    ).toThrow(/GPU 0 has 20\.90 GiB free; a shared-cache engine needs 16\.00 GiB .*21\.00 GiB in all/)
    expect(placeOnGpus([gpu(0, need)], { ...shared, gpuIds: [0], sharedCacheEstimate: est })).toEqual([0])
    // Without gpu_ids the GPU with the most free memory is tried.
    expect(placeOnGpus([gpu(0, need - 1), gpu(1, need)], { ...shared, sharedCacheEstimate: est })).toEqual([
      1,
    ])
    // What engines still starting will claim counts against the free memory.
    expect(() =>
      placeOnGpus([gpu(0, need)], {
        ...shared,
        gpuIds: [0],
        sharedCacheEstimate: est,
        pendingMibByGpu: new Map([[0, 1]]),
      }),
    ).toThrow(/INSUFFICIENT_MEMORY|GPU 0 has/)
  })

  it('estimates from the engines of the same model that reported their memory (TP 1 only)', () => {
    const rows = [
      row({ memory_metrics: metrics(72, 56, 512, 32768) }),
      row({ memory_metrics: metrics(72, 57, 512, 32768) }),
      row({ model_path: 'other', memory_metrics: metrics(72, 10, 512, 32768) }),
      row({ tensor_parallel_size: 2, memory_metrics: metrics(72, 10, 512, 32768) }),
      row({}),
    ]
    expect(sharedCacheEstimate(rows, 'Qwen/Qwen2.5-7B-Instruct')).toEqual({
      nonKvMib: 16 * 1024,
      requestKvMib: 512,
    })
    // KV for one request scales with the load's max_tokens.
    expect(sharedCacheEstimate(rows, 'Qwen/Qwen2.5-7B-Instruct', 65536)?.requestKvMib).toBe(1024)
    expect(sharedCacheEstimate(rows, 'never-loaded')).toBeNull()
  })

  it('counts a starting shared-cache engine by its start allocation, a plain one by its budget', () => {
    const est = { nonKvMib: 16 * 1024, requestKvMib: 1024 }
    expect(startingClaimMib(row({}), TOTAL, 1024, est)).toBe(16 * 1024)
    expect(startingClaimMib(row({}), TOTAL, 0, null)).toBe(SHARED_CACHE_MIN_KV_MIB)
    expect(startingClaimMib(row({ sharedcache_enabled: false }), TOTAL, 1024)).toBe(0.9 * TOTAL - 1024)
    expect(startingClaimMib(row({}), TOTAL, 40 * 1024, est)).toBe(0)
  })
})
