import { KVCACHED_GPU_UTILIZATION } from '../../src/gpu/kvcached.ts'
import { gpuMemoryMib } from '../../src/gpu/memory.ts'
import type { GpuApp, GpuInfo } from '../../src/gpu/smi.ts'
import { badRequest, insufficientMemory } from '../../src/http/errors.ts'
import type { InstanceRow } from './db/schema.ts'

/**
 * Placement decides which GPUs a load uses and whether it fits, before any process is spawned,
 * counting what loads still in progress will take.
 *
 * A plain engine: vLLM refuses to start when a GPU's free memory is below gpu_memory_utilization ×
 * its total, so the same rule is checked up front.
 *
 * A shared-cache (kvcached) engine: kvcached patches that check away ("Ignoring vLLM's whole-device
 * startup memory guard") and backs the KV cache lazily, so this check is the only guard. What the
 * engine needs free at start is what it allocates for real: its weights, CUDA graphs and overhead
 * (the non-KV part, measured by an earlier engine of the same model, else not known), KV pages for
 * at least one request (never less than kvcached's first reserved pages), and kvcached's reserve —
 * it never maps pages into the last (1 − KVCACHED_GPU_UTILIZATION) of the device, 5% by default.
 */
export interface PlacementRequest {
  gpuIds?: number[]
  tensorParallelSize: number
  gpuMemoryUtilization: number
  sharedCache: boolean
  /** pendingMibByGpu: memory starting engines will still claim on each GPU. */
  pendingMibByGpu: ReadonlyMap<number, number>
  /** sharedCacheEstimate: what the model measured (sharedCacheEstimate()); null when never measured. */
  sharedCacheEstimate?: SharedCacheEstimate | null
}

/** SharedCacheEstimate: a shared-cache engine's per-GPU non-KV part and KV for one request (MiB). */
export interface SharedCacheEstimate {
  nonKvMib: number
  requestKvMib: number
}

/** SHARED_CACHE_MIN_KV_MIB: the least KV a shared-cache engine maps at start (its reserved pages). */
export const SHARED_CACHE_MIN_KV_MIB = 1024

const gib = (mib: number) => (mib / 1024).toFixed(2)

/**
 * sharedCacheEstimate reads the non-KV part and the KV of one request (at `maxTokens`, else the
 * measured max model len) from the instances of the same model (TP 1) that reported their memory;
 * the largest non-KV part wins. Null when none did.
 */
export function sharedCacheEstimate(
  rows: Iterable<InstanceRow>,
  modelPath: string,
  maxTokens?: number,
): SharedCacheEstimate | null {
  let best: SharedCacheEstimate | null = null
  for (const r of rows) {
    const m = r.memory_metrics
    if (r.model_path !== modelPath || r.tensor_parallel_size !== 1 || !m) continue
    const nonKvMib = Math.max(0, m.total_gpu_memory_gib - m.kv_cache_available_gib) * 1024
    const perToken = m.max_model_len > 0 ? m.kv_cache_per_request_mib / m.max_model_len : 0
    const requestKvMib = perToken * (maxTokens ?? m.max_model_len)
    if (!best || nonKvMib > best.nonKvMib) best = { nonKvMib, requestKvMib }
  }
  return best
}

/** sharedCacheStartMib: what a starting shared-cache engine allocates on its GPU (no reserve). */
export function sharedCacheStartMib(est: SharedCacheEstimate | null | undefined): number {
  return (est?.nonKvMib ?? 0) + Math.max(SHARED_CACHE_MIN_KV_MIB, est?.requestKvMib ?? 0)
}

/** sharedCacheNeed: the free memory a shared-cache engine needs on a GPU, and why (for the 400). */
export function sharedCacheNeed(totalMib: number, est: SharedCacheEstimate | null | undefined) {
  const reserveMib = Math.round((1 - KVCACHED_GPU_UTILIZATION) * totalMib)
  const kvMib = sharedCacheStartMib(est) - (est?.nonKvMib ?? 0)
  const nonKv = est ? `${gib(est.nonKvMib)} GiB for weights, CUDA graphs and overhead (measured), ` : ''
  const why =
    `a shared-cache engine needs ${nonKv}${gib(kvMib)} GiB of KV cache to start and kvcached's reserve of ` +
    `${gib(reserveMib)} GiB (${Math.round((1 - KVCACHED_GPU_UTILIZATION) * 100)}% of ${gib(totalMib)} GiB), ` +
    `${gib(sharedCacheStartMib(est) + reserveMib)} GiB in all` +
    (est ? '' : ' (its weights are not known yet: no engine of this model has reported them)')
  return { needMib: sharedCacheStartMib(est) + reserveMib, why }
}

/** freeMib is a GPU's free memory minus what engines still loading will claim. */
export function effectiveFreeMib(g: GpuInfo, pending: ReadonlyMap<number, number>): number {
  const free = gpuMemoryMib(g).free ?? 0
  return Math.max(0, free - (pending.get(g.index) ?? 0))
}

export function placeOnGpus(gpus: readonly GpuInfo[], req: PlacementRequest): number[] {
  const { tensorParallelSize: tp } = req
  const byIndex = new Map(gpus.map((g) => [g.index, g]))
  let chosen: GpuInfo[]
  if (req.gpuIds) {
    const missing = req.gpuIds.filter((id) => !byIndex.has(id))
    if (missing.length)
      throw badRequest(
        `GPU ${missing.join(', ')} does not exist (available: ${[...byIndex.keys()].join(', ') || 'none'})`,
      )
    chosen = req.gpuIds.map((id) => byIndex.get(id)!)
  } else {
    if (gpus.length < tp)
      throw badRequest(`tensor_parallel_size ${tp} needs ${tp} GPUs but this host has ${gpus.length}`)
    chosen = [...gpus]
      .sort(
        (a, b) =>
          effectiveFreeMib(b, req.pendingMibByGpu) - effectiveFreeMib(a, req.pendingMibByGpu) ||
          a.index - b.index,
      )
      .slice(0, tp)
  }
  for (const g of chosen) {
    const total = gpuMemoryMib(g).total
    if (total === null) continue
    const free = effectiveFreeMib(g, req.pendingMibByGpu)
    const { needMib, why } = req.sharedCache
      ? sharedCacheNeed(total, req.sharedCacheEstimate)
      : {
          needMib: req.gpuMemoryUtilization * total,
          why: `the engine needs ${gib(req.gpuMemoryUtilization * total)} GiB (gpu_memory_utilization ${req.gpuMemoryUtilization} × ${gib(total)} GiB)`,
        }
    if (free < needMib) throw insufficientMemory(`GPU ${g.index} has ${gib(free)} GiB free; ${why}`)
  }
  return chosen.map((g) => g.index).sort((a, b) => a - b)
}

/**
 * startingClaimMib: what a starting engine will still take on a GPU beyond the `seenMib` nvidia-smi
 * already shows for it — utilization × total for a plain engine, its start allocation for a
 * shared-cache one (kvcached's reserve is the GPU's, counted once by the load being placed).
 */
export function startingClaimMib(
  row: InstanceRow,
  totalMib: number,
  seenMib: number,
  est?: SharedCacheEstimate | null,
): number {
  const claim = row.sharedcache_enabled ? sharedCacheStartMib(est) : row.gpu_memory_utilization * totalMib
  return Math.max(0, claim - seenMib)
}

/** usedMibByGpuForPids sums compute-app memory of the given pids per GPU index. */
export function usedMibByGpuForPids(
  gpus: readonly GpuInfo[],
  apps: readonly GpuApp[],
  pids: ReadonlySet<number>,
): Map<number, number> {
  const indexByUuid = new Map(gpus.map((g) => [g.uuid, g.index]))
  const out = new Map<number, number>()
  for (const a of apps) {
    if (a.pid === null || !pids.has(a.pid)) continue
    const idx = indexByUuid.get(a.gpuUuid)
    if (idx === undefined) continue
    out.set(idx, (out.get(idx) ?? 0) + (a.usedMemoryMib ?? 0))
  }
  return out
}
