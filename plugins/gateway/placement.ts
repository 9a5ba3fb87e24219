import { gpuMemoryMib } from '../../src/gpu/memory.ts'
import type { GpuApp, GpuInfo } from '../../src/gpu/smi.ts'
import { badRequest, insufficientMemory } from '../../src/http/errors.ts'

/**
 * Placement decides which GPUs a load uses and whether it fits, before any process is spawned.
 * vLLM refuses to start when a GPU's free memory is below gpu_memory_utilization × its total, so
 * the same rule is checked up front, counting what loads still in progress will take.
 */
export interface PlacementRequest {
  gpuIds?: number[]
  tensorParallelSize: number
  gpuMemoryUtilization: number
  sharedCache: boolean
  /** pendingMibByGpu: memory starting engines will still claim on each GPU. */
  pendingMibByGpu: ReadonlyMap<number, number>
}

const gib = (mib: number) => (mib / 1024).toFixed(2)

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
    const need = req.sharedCache ? 1024 : req.gpuMemoryUtilization * total
    if (free < need) {
      const why = req.sharedCache
        ? 'the shared KV cache needs at least 1.00 GiB'
        : `the engine needs ${gib(need)} GiB (gpu_memory_utilization ${req.gpuMemoryUtilization} × ${gib(total)} GiB)`
      throw insufficientMemory(`GPU ${g.index} has ${gib(free)} GiB free; ${why}`)
    }
  }
  return chosen.map((g) => g.index).sort((a, b) => a - b)
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
