import { badRequest } from '../../src/http/errors.ts'
import { sseResponse } from '../../src/http/sse.ts'
import type { PodRecords } from './api.ts'
import { INSTANCE_EVENT_TYPES, type InstanceEventType } from './events.ts'
import type { GatewayService } from './service.ts'
import { gpuAvailableView, multiGpuView } from './views.ts'

/**
 * podRecords: what the gateway's lifecycle and view routes answer (PodRecords), written once: its
 * own routes answer with these, and a cluster answers its peers and its own API with them
 * (GatewayPodApi.records), so an answer relayed from a pod is that pod's own record.
 */
export function podRecords(service: GatewayService): PodRecords {
  return {
    load: (req) => service.load(req),
    unload: async (id) => {
      await service.unload(id)
      return { status: 'stopping', instance_id: id, message: 'unload started' }
    },
    sleep: (id, query) =>
      service.sleep(
        id,
        (query.level ?? 1) as 1 | 2,
        query.drain_timeout_ms === undefined ? {} : { drainTimeoutMs: query.drain_timeout_ms },
      ),
    wake: (id, body) => {
      const raw = body?.tags
      return service.wake(id, raw === undefined ? [] : Array.isArray(raw) ? raw : [raw])
    },
    logs: (id, query) => {
      const inst = service.require(id)
      const lines = inst.events.recentLogs(query.lines ?? 100)
      return { instance_id: inst.id, logs: lines.join('\n'), line_count: lines.length }
    },
    events: (id, query, signal) => {
      const inst = service.require(id)
      const types = parseTypes(query.types)
      const replay = query.replay_logs !== 'false'
      // sseResponse runs `start` at once, so the instance found above is the one subscribed to.
      return sseResponse(
        (sink) =>
          inst.events.subscribe(
            types,
            replay,
            (e) => sink.send(e.eventType, e, e.id),
            () => sink.close(),
          ),
        { signal },
      )
    },
    gpuAvailable: () => gpuAvailableView(service),
    multiGpu: () => multiGpuView(service),
  }
}

/** parseTypes reads an event stream's `types` (a comma list, default all): 400 on an unknown one. */
function parseTypes(raw: string | undefined): Set<InstanceEventType> {
  if (!raw || raw === 'all') return new Set(INSTANCE_EVENT_TYPES)
  const out = new Set<InstanceEventType>()
  for (const part of raw
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)) {
    if (!(INSTANCE_EVENT_TYPES as readonly string[]).includes(part))
      throw badRequest(`query.types: unknown event type '${part}' (use ${INSTANCE_EVENT_TYPES.join(', ')})`)
    out.add(part as InstanceEventType)
  }
  return out
}
