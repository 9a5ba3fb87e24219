import { AppError } from '../../../src/http/errors.ts'
import type { GatewayApi } from '../../gateway/api.ts'
import type { GpuInfo, ModelsFull } from './schemas.ts'

/**
 * The two views of a pod the cluster adds to its gateway's own records (GatewayPodApi.records): its
 * full instance records, and nvidia-smi's GPUs with the processes on each.
 */

/** modelsFull: every instance record of this pod, with its detail fields. */
export function modelsFull(gateway: GatewayApi): ModelsFull {
  const models = gateway.list()
  return { models, total: models.length }
}

/** gpuInfo: nvidia-smi's GPUs with the compute processes on each (503 without a probe). */
export async function gpuInfo(gateway: GatewayApi): Promise<GpuInfo> {
  const snap = await gateway.gpuReading()
  if (!snap.available)
    throw new AppError(503, 'GPU_PROBE_UNAVAILABLE', `No GPU probe available: ${snap.reason}`)
  return {
    gpus: snap.gpus.map((g) => ({
      index: g.index,
      uuid: g.uuid,
      name: g.name,
      memory_total_mb: g.memoryTotalMib,
      memory_used_mb: g.memoryUsedMib,
      memory_free_mb: g.memoryFreeMib,
      utilization_percent: g.utilizationPercent,
      temperature_c: g.temperatureC,
      processes: snap.apps
        .filter((a) => a.gpuUuid === g.uuid)
        .map((a) => ({ pid: a.pid, process_name: a.processName, used_memory_mb: a.usedMemoryMib })),
    })),
    taken_at: new Date(snap.takenAt).toISOString(),
  }
}
