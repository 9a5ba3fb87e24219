import { groupPids } from '../../src/engine/process.ts'
import {
  gpuAvailability,
  type KvUsage,
  type ModelMemoryInput,
  type MultiGpuInstanceInput,
  multiGpuMemoryView,
  otherProcessMibByGpu,
  singleMemoryView,
  sumKvUsage,
} from '../../src/gpu/memory.ts'
import type { GpuSnapshot } from '../../src/gpu/smi.ts'
import { AppError } from '../../src/http/errors.ts'
import type { ManagedInstance } from './instance.ts'
import type { GatewayService } from './service.ts'

/**
 * GPU and memory views: live nvidia-smi data + the instances' recorded footprints + the shared
 * KV-cache pool of each GPU (the sum of its engines' kvcached segments, SharedCache.usageByGpu; for
 * other engines the KV-cache usage their /metrics report, e.g. vllm:kv_cache_usage_perc), fed through the
 * formulas in src/gpu/memory.ts. A host without a GPU probe answers 503 GPU_PROBE_UNAVAILABLE
 * naming the reason, never a 500.
 */
const GIB = 2 ** 30

function requireGpus(snap: GpuSnapshot) {
  if (!snap.available)
    throw new AppError(503, 'GPU_PROBE_UNAVAILABLE', `No GPU probe available: ${snap.reason}`)
  return snap
}

/** placed: instances that hold GPU memory, oldest first (stable display names and colours). */
function placed(service: GatewayService): ManagedInstance[] {
  return [...service.instances.values()]
    .filter((i) => i.status !== 'failed')
    .sort((a, b) => a.row.loaded_at.localeCompare(b.row.loaded_at) || a.id.localeCompare(b.id))
}

function modelInput(i: ManagedInstance): ModelMemoryInput {
  const m = i.row.memory_metrics
  return {
    instance_id: i.id,
    model_path: i.row.model_path,
    model_name: i.row.model_name,
    gpu_ids: i.row.gpu_ids,
    weights_gib: m?.weights_memory_gib ?? null,
    cuda_graph_gib: m?.cuda_graph_memory_gib ?? null,
    holds_gib_by_gpu: i.holdsGibByGpu(),
  }
}

/** kvUsagePerc asks an engine for its KV-cache usage (0–1), null when it does not answer. */
async function kvUsagePerc(i: ManagedInstance): Promise<number | null> {
  if (i.status !== 'active') return i.status === 'sleeping' ? 0 : null
  return i.client.kvCacheUsage().catch(() => null)
}

export async function gpuAvailableView(service: GatewayService) {
  const snap = requireGpus(await service.gpuReading())
  const perGpu = new Map<number, number>()
  for (const i of placed(service)) for (const g of i.row.gpu_ids) perGpu.set(g, (perGpu.get(g) ?? 0) + 1)
  return gpuAvailability(snap.gpus, perGpu)
}

/** The shm directory is the shared cache's own (plugins.gateway.sharedcache.shm_dir); `_shmDir` is unused. */
export async function memoryUsageView(service: GatewayService, _shmDir?: string) {
  const snap = requireGpus(await service.gpuReading())
  const instances = placed(service)
  const segments = service.sharedCache.usageByGpu()
  let kv: KvUsage | null = null
  if (instances.length) {
    const derived = await Promise.all(
      instances
        .filter((i) => !i.row.sharedcache_enabled)
        .map(async (i) => {
          const perc = (await kvUsagePerc(i)) ?? 0
          const avail = i.row.memory_metrics?.kv_cache_available_gib ?? 0
          return { usedBytes: perc * avail * i.row.tensor_parallel_size * GIB, preallocBytes: 0 }
        }),
    )
    kv = sumKvUsage([...segments.values(), ...derived])
  }
  return singleMemoryView({ gpus: snap.gpus, models: instances.map(modelInput), kv })
}

export async function multiGpuView(service: GatewayService, _shmDir?: string) {
  const snap = requireGpus(await service.gpuReading())
  const instances = placed(service)
  const inputs: MultiGpuInstanceInput[] = await Promise.all(
    instances.map(async (i) => ({
      ...modelInput(i),
      memory_baseline_by_gpu: baselineNumbers(i.row.memory_baseline_by_gpu),
      sharedcache_enabled: i.row.sharedcache_enabled,
      kv_cache_usage_perc: i.row.sharedcache_enabled ? null : await kvUsagePerc(i),
      kv_cache_available_gib: i.row.memory_metrics?.kv_cache_available_gib ?? null,
    })),
  )
  const enginePids = new Set(instances.flatMap((i) => (i.row.pgid ? groupPids(i.row.pgid) : [])))
  return multiGpuMemoryView({
    gpus: snap.gpus,
    instances: inputs,
    otherProcessesMibByGpu: otherProcessMibByGpu(snap.gpus, snap.apps, enginePids),
    kvSegmentsByGpu: service.sharedCache.usageByGpu(),
  })
}

function baselineNumbers(b: Record<string, number> | null): Record<number, number> | null {
  if (!b) return null
  return Object.fromEntries(Object.entries(b).map(([k, v]) => [Number(k), v]))
}
