/**
 * memory holds the formulas behind GET /api/gpu/available, /api/memory/usage and
 * /api/memory/usage/multi-gpu, as pure functions over live inputs (an nvidia-smi snapshot, the
 * instances' parsed memory metrics, kvcached segments) so they can be tested with plain numbers.
 *
 * Units: every `_gb` field is GiB (nvidia-smi MiB ÷ 1024) and every `_mb` field is nvidia-smi's MiB,
 * rounded to 2 decimals in views. Unknown nvidia-smi values (`[N/A]`) stay null in per-GPU rows
 * (one of total/used/free is derived when the other two are known), count as 0 in sums and in
 * rankings, and are left out of utilization averages (0 when no GPU reports one).
 */
import { displayNames, instanceColors, shortModelName } from './colors.ts'
import type { GpuApp, GpuInfo } from './smi.ts'

export const BYTES_PER_GIB = 2 ** 30
export const mibToGib = (mib: number): number => mib / 1024
export const round2 = (n: number): number => Math.round(n * 100) / 100
const gb = (mib: number | null): number | null => (mib === null ? null : round2(mibToGib(mib)))

/** gpuMemoryMib returns total/used/free, deriving one unknown from the other two. */
export function gpuMemoryMib(g: GpuInfo): { total: number | null; used: number | null; free: number | null } {
  const { memoryTotalMib: total, memoryUsedMib: used, memoryFreeMib: free } = g
  return {
    total: total ?? (used !== null && free !== null ? used + free : null),
    used: used ?? (total !== null && free !== null ? Math.max(0, total - free) : null),
    free: free ?? (total !== null && used !== null ? Math.max(0, total - used) : null),
  }
}

const freeMib = (g: GpuInfo): number => gpuMemoryMib(g).free ?? 0
const byMostFree = (a: GpuInfo, b: GpuInfo): number => freeMib(b) - freeMib(a) || a.index - b.index

export interface GpuAvailabilityRow {
  index: number
  name: string
  memory_total_mb: number | null
  memory_used_mb: number | null
  memory_free_mb: number | null
  utilization_percent: number | null
  models_loaded: number
  recommended: boolean
}

export interface GpuAvailability {
  gpus: GpuAvailabilityRow[]
  recommendation: { gpu_id: number; free_memory_gb: number; reason: string } | null
}

/** gpuAvailability lists the GPUs and recommends the one with the most free memory (ties: lowest index). */
export function gpuAvailability(
  gpus: readonly GpuInfo[],
  modelsPerGpu: ReadonlyMap<number, number>,
): GpuAvailability {
  const best = [...gpus].sort(byMostFree)[0]
  const rows = gpus.map((g) => {
    const mem = gpuMemoryMib(g)
    return {
      index: g.index,
      name: g.name,
      memory_total_mb: mem.total,
      memory_used_mb: mem.used,
      memory_free_mb: mem.free,
      utilization_percent: g.utilizationPercent,
      models_loaded: modelsPerGpu.get(g.index) ?? 0,
      recommended: g === best,
    }
  })
  if (!best) return { gpus: rows, recommendation: null }
  const freeGb = round2(mibToGib(freeMib(best)))
  return {
    gpus: rows,
    recommendation: {
      gpu_id: best.index,
      free_memory_gb: freeGb,
      reason: `GPU ${best.index} has the most free memory (${freeGb.toFixed(2)} GB)`,
    },
  }
}

/** chooseGpus picks the `count` GPUs with the most free memory, most free first (ties: lowest index). */
export function chooseGpus(
  gpus: readonly GpuInfo[],
  count: number,
  exclude: Iterable<number> = [],
): GpuInfo[] {
  const skip = new Set(exclude)
  return gpus
    .filter((g) => !skip.has(g.index))
    .sort(byMostFree)
    .slice(0, Math.max(0, count))
}

/** ModelMemoryInput is an instance as the views need it; weights and CUDA graphs are per GPU. */
export interface ModelMemoryInput {
  instance_id: string
  model_path: string
  model_name?: string | null
  gpu_ids: readonly number[]
  weights_gib?: number | null
  cuda_graph_gib?: number | null
  /**
   * holds_gib_by_gpu: what the instance holds on each GPU now (the gateway's one figure of it,
   * ManagedInstance.holdsGibByGpu); absent or null: weights + CUDA graphs stand in.
   */
  holds_gib_by_gpu?: Readonly<Record<string, number>> | null
}

export interface ModelMemoryRecord {
  model_path: string
  instance_id: string
  display_name: string
  /** What the instance holds now: on the row's GPU (per-GPU rows), or on all its GPUs. */
  gpu_memory_gb: number
  /** Of that, its weights and CUDA graphs (the rest: KV cache and overhead). */
  weights_gb: number
  color: string
}

const perGpuModelGib = (m: ModelMemoryInput): number => (m.weights_gib ?? 0) + (m.cuda_graph_gib ?? 0)

/** holdsOn: what `m` holds on GPU `gpu` now, else its weights + CUDA graphs there. */
function holdsOn(m: ModelMemoryInput, gpu: number): number {
  return m.holds_gib_by_gpu?.[String(gpu)] ?? perGpuModelGib(m)
}

/**
 * modelRecords labels and colours instances in the order given (oldest first). gpu_memory_gb is
 * what the instance holds now (holds_gib_by_gpu; without it weights + CUDA graphs): summed over its
 * GPUs for scope 'total', one GPU's for 'per_gpu' (multiGpuMemoryView gives each row its GPU's);
 * weights_gb is its weights + CUDA graphs on the same scope.
 */
export function modelRecords(
  instances: readonly ModelMemoryInput[],
  scope: 'total' | 'per_gpu' = 'total',
): ModelMemoryRecord[] {
  const names = displayNames(
    instances.map((m) => ({
      instance_id: m.instance_id,
      name: m.model_name || shortModelName(m.model_path),
    })),
  )
  const colors = instanceColors(instances.map((m) => m.instance_id))
  const gpus = (m: ModelMemoryInput) => (scope === 'total' ? Math.max(1, m.gpu_ids.length) : 1)
  return instances.map((m) => ({
    model_path: m.model_path,
    instance_id: m.instance_id,
    display_name: names.get(m.instance_id) ?? m.instance_id,
    gpu_memory_gb: round2(
      scope === 'total' && m.holds_gib_by_gpu && m.gpu_ids.length
        ? m.gpu_ids.reduce((a, g) => a + holdsOn(m, g), 0)
        : (m.gpu_ids[0] === undefined ? perGpuModelGib(m) : holdsOn(m, m.gpu_ids[0])) * gpus(m),
    ),
    weights_gb: round2(perGpuModelGib(m) * gpus(m)),
    color: colors.get(m.instance_id) ?? '#888888',
  }))
}

/** KvUsage is what a kvcached segment (or a sum of them) says is in use, in bytes. */
export interface KvUsage {
  usedBytes: number
  preallocBytes: number
}

export interface KvCacheRecord {
  total_gb: number
  prealloc_gb: number
  used_gb: number
  free_gb: number
}

export interface GpuSummary {
  total_gb: number
  used_gb: number
  free_gb: number
  utilization_percent: number
}

export interface SingleMemoryView {
  kvcache?: KvCacheRecord
  gpu: GpuSummary
  models: ModelMemoryRecord[]
}

/** sumKvUsage adds several segments' figures (e.g. one pool per GPU). */
export function sumKvUsage(list: readonly KvUsage[]): KvUsage {
  return list.reduce(
    (a, b) => ({ usedBytes: a.usedBytes + b.usedBytes, preallocBytes: a.preallocBytes + b.preallocBytes }),
    {
      usedBytes: 0,
      preallocBytes: 0,
    },
  )
}

function kvRecord(totalGib: number, usedGib: number, preallocGib: number): KvCacheRecord {
  return {
    total_gb: round2(totalGib),
    prealloc_gb: round2(preallocGib),
    used_gb: round2(usedGib),
    free_gb: round2(Math.max(0, totalGib - usedGib - preallocGib)),
  }
}

function gpuSummary(gpus: readonly GpuInfo[]): GpuSummary {
  const sum = (pick: (m: ReturnType<typeof gpuMemoryMib>) => number | null): number =>
    gpus.reduce((acc, g) => acc + (pick(gpuMemoryMib(g)) ?? 0), 0)
  const utils = gpus.map((g) => g.utilizationPercent).filter((u): u is number => u !== null)
  return {
    total_gb: round2(mibToGib(sum((m) => m.total))),
    used_gb: round2(mibToGib(sum((m) => m.used))),
    free_gb: round2(mibToGib(sum((m) => m.free))),
    utilization_percent: utils.length ? round2(utils.reduce((a, b) => a + b, 0) / utils.length) : 0,
  }
}

/**
 * singleMemoryView is the whole host as one pool: KVCache Total = GPU Free + Prealloc + Used and
 * KVCache Free = max(0, Total − Used − Prealloc), GPU figures summed over GPUs. `kv` is the shared
 * pool's usage (null: none). kvcache is omitted when no model is loaded.
 */
export function singleMemoryView(input: {
  gpus: readonly GpuInfo[]
  models: readonly ModelMemoryInput[]
  kv: KvUsage | null
}): SingleMemoryView {
  const gpu = gpuSummary(input.gpus)
  const models = modelRecords(input.models)
  if (input.models.length === 0) return { gpu, models }
  const freeGib = mibToGib(input.gpus.reduce((acc, g) => acc + freeMib(g), 0))
  const usedGib = (input.kv?.usedBytes ?? 0) / BYTES_PER_GIB
  const preallocGib = (input.kv?.preallocBytes ?? 0) / BYTES_PER_GIB
  return { kvcache: kvRecord(freeGib + preallocGib + usedGib, usedGib, preallocGib), gpu, models }
}

/**
 * MultiGpuInstanceInput adds what the per-GPU pool needs. memory_baseline_by_gpu is the footprint
 * per GPU in GiB captured at ready (weights + graphs + overhead; without it, weights + graphs).
 * kv_cache_usage_perc (0–1, from the engine's metrics) × kv_cache_available_gib (per GPU, as in
 * MemoryMetrics) gives the KV in use where no kvcached segment covers the engine.
 */
export interface MultiGpuInstanceInput extends ModelMemoryInput {
  memory_baseline_by_gpu?: Readonly<Record<number, number>> | ReadonlyMap<number, number> | null
  sharedcache_enabled?: boolean
  kv_cache_usage_perc?: number | null
  kv_cache_available_gib?: number | null
}

export interface GpuMemoryRow {
  gpu_index: number
  name: string
  total_gb: number | null
  used_gb: number | null
  free_gb: number | null
  utilization_percent: number | null
  models: ModelMemoryRecord[]
  kvcache?: KvCacheRecord
}

export interface MultiGpuMemoryView {
  gpus: GpuMemoryRow[]
  kvcache: KvCacheRecord
  total_system_free_gb: number
}

function baselineGib(m: MultiGpuInstanceInput, gpu: number): number {
  const held = m.holds_gib_by_gpu?.[String(gpu)]
  if (held !== undefined) return held
  const map = m.memory_baseline_by_gpu
  const value = map instanceof Map ? map.get(gpu) : (map as Record<number, number> | null | undefined)?.[gpu]
  return value ?? perGpuModelGib(m)
}

/**
 * derivedKvUsedGib is one GPU's share of an engine's KV in use. The engine-wide figure
 * (usage × per-GPU available × GPU count) split evenly over its GPUs is usage × per-GPU available.
 */
function derivedKvUsedGib(m: MultiGpuInstanceInput): number {
  return Math.max(0, m.kv_cache_usage_perc ?? 0) * Math.max(0, m.kv_cache_available_gib ?? 0)
}

/**
 * multiGpuMemoryView gives each GPU its own pool: total = GPU Total − Model Baselines − Other
 * Processes; used and prealloc from that GPU's kvcached segment (kvSegmentsByGpu: that GPU's share
 * only) for shared-cache engines, plus every other engine's usage derived from its metrics; free =
 * max(0, total − used − prealloc). Top-level kvcache sums the GPUs' pools (zeros when none).
 */
export function multiGpuMemoryView(input: {
  gpus: readonly GpuInfo[]
  instances: readonly MultiGpuInstanceInput[]
  otherProcessesMibByGpu?: ReadonlyMap<number, number>
  kvSegmentsByGpu?: ReadonlyMap<number, KvUsage>
}): MultiGpuMemoryView {
  const perGpuRecords = new Map(modelRecords(input.instances, 'per_gpu').map((r) => [r.instance_id, r]))
  const total = { total: 0, used: 0, prealloc: 0 }
  let systemFreeMib = 0
  const rows = input.gpus.map((g): GpuMemoryRow => {
    const mem = gpuMemoryMib(g)
    systemFreeMib += mem.free ?? 0
    const onGpu = input.instances.filter((m) => m.gpu_ids.includes(g.index))
    const row: GpuMemoryRow = {
      gpu_index: g.index,
      name: g.name,
      total_gb: gb(mem.total),
      used_gb: gb(mem.used),
      free_gb: gb(mem.free),
      utilization_percent: g.utilizationPercent,
      models: onGpu.flatMap((m) => {
        const r = perGpuRecords.get(m.instance_id)
        return r ? [{ ...r, gpu_memory_gb: round2(baselineGib(m, g.index)) }] : []
      }),
    }
    if (onGpu.length === 0) return row
    const baselines = onGpu.reduce((acc, m) => acc + baselineGib(m, g.index), 0)
    const other = mibToGib(input.otherProcessesMibByGpu?.get(g.index) ?? 0)
    const poolTotal = Math.max(0, mibToGib(mem.total ?? 0) - baselines - other)
    const segment = input.kvSegmentsByGpu?.get(g.index)
    let used = (segment?.usedBytes ?? 0) / BYTES_PER_GIB
    const prealloc = (segment?.preallocBytes ?? 0) / BYTES_PER_GIB
    for (const m of onGpu) if (!(segment && m.sharedcache_enabled)) used += derivedKvUsedGib(m)
    row.kvcache = kvRecord(poolTotal, used, prealloc)
    total.total += poolTotal
    total.used += used
    total.prealloc += prealloc
    return row
  })
  return {
    gpus: rows,
    kvcache: kvRecord(total.total, total.used, total.prealloc),
    total_system_free_gb: round2(mibToGib(systemFreeMib)),
  }
}

/**
 * otherProcessMibByGpu sums, per GPU index, the memory of compute processes that are not ours.
 * `enginePids` should hold every pid of our engines' process trees (vLLM's GPU work runs in child
 * processes). Apps with an unknown pid are not counted, since they cannot be told apart. In a
 * container without the host PID namespace no pid matches: pass an empty map instead.
 */
export function otherProcessMibByGpu(
  gpus: readonly GpuInfo[],
  apps: readonly GpuApp[],
  enginePids: ReadonlySet<number>,
): Map<number, number> {
  const indexByUuid = new Map(gpus.map((g) => [g.uuid, g.index]))
  const out = new Map<number, number>()
  for (const app of apps) {
    const index = indexByUuid.get(app.gpuUuid)
    if (index === undefined || app.pid === null || enginePids.has(app.pid)) continue
    out.set(index, (out.get(index) ?? 0) + (app.usedMemoryMib ?? 0))
  }
  return out
}
