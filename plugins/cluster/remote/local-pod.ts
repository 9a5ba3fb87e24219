import { AppError, modelNotFound } from '../../../src/http/errors.ts'
import { sseResponse } from '../../../src/http/sse.ts'
import {
  type GatewayPodApi,
  type GpuAvailable,
  INSTANCE_EVENT_TYPES,
  type InstanceEventType,
  type LoadRequest,
  type LoadResponse,
  type LogRecord,
  type MultiGpuMemory,
  type SleepLevel,
  type SleepResult,
  type WakeResult,
} from '../../gateway/api.ts'
import type { GpuInfo, ModelsFull, UnloadResult, WakeTags } from './schemas.ts'

/** EventsFilter: the single-pod event stream's query, as received. */
export interface EventsFilter {
  types?: string | undefined
  replay_logs?: string | undefined
}

/**
 * LocalPod: what this pod does for the cluster's remote lifecycle, on its own gateway. The internal
 * routes answer a peer with it and the cluster routes use it when this pod owns the instance, so a
 * remote answer and a local one are the same record from the same code.
 */
export class LocalPod {
  constructor(private readonly gateway: GatewayPodApi) {}

  load(req: LoadRequest): Promise<LoadResponse> {
    return this.gateway.load(req)
  }

  async unload(id: string): Promise<UnloadResult> {
    await this.gateway.unload(id)
    return { status: 'stopping', instance_id: id, message: 'unload started' }
  }

  sleep(id: string, level: SleepLevel, drainTimeoutMs?: number): Promise<SleepResult> {
    return this.gateway.sleep(id, level, drainTimeoutMs === undefined ? {} : { drainTimeoutMs })
  }

  wake(id: string, tags: WakeTags): Promise<WakeResult> {
    return this.gateway.wake(id, tags === undefined ? [] : Array.isArray(tags) ? tags : [tags])
  }

  logs(id: string, lines = 100): LogRecord {
    return this.gateway.instanceLogs(id, lines)
  }

  models(): ModelsFull {
    const models = this.gateway.list()
    return { models, total: models.length }
  }

  gpuAvailable(): Promise<GpuAvailable> {
    return this.gateway.gpuAvailable()
  }

  memory(): Promise<MultiGpuMemory> {
    return this.gateway.multiGpuMemory()
  }

  /** gpuInfo: nvidia-smi's GPUs with the compute processes on each (503 without a probe). */
  async gpuInfo(): Promise<GpuInfo> {
    const snap = await this.gateway.gpuSnapshot()
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

  /**
   * events: the instance's event stream (SSE) as GET /api/v1/models/instances/{id}/events sends it;
   * 404 before the stream opens when the instance is unknown. It ends when the instance is gone or
   * `signal` aborts (the client left).
   */
  events(id: string, filter: EventsFilter, signal: AbortSignal): Response {
    const types = parseTypes(filter.types)
    const replayLogs = filter.replay_logs !== 'false'
    if (!this.gateway.get(id)) throw modelNotFound(id)
    // sseResponse runs `start` at once, so the instance checked above is the one subscribed to.
    return sseResponse(
      (sink) =>
        this.gateway.subscribeInstanceEvents(
          id,
          { types, replayLogs },
          (e) => sink.send(e.eventType, e, e.id),
          () => sink.close(),
        ),
      { signal },
    )
  }
}

/** parseTypes reads `types` (comma list, default all) as the single-pod stream does: 400 on an unknown one. */
function parseTypes(raw: string | undefined): InstanceEventType[] {
  if (!raw || raw === 'all') return [...INSTANCE_EVENT_TYPES]
  const out: InstanceEventType[] = []
  for (const part of raw
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)) {
    if (!(INSTANCE_EVENT_TYPES as readonly string[]).includes(part))
      throw new AppError(
        400,
        'VALIDATION_ERROR',
        `query.types: unknown event type '${part}' (use ${INSTANCE_EVENT_TYPES.join(', ')})`,
      )
    if (!out.includes(part as InstanceEventType)) out.push(part as InstanceEventType)
  }
  return out
}
