import { Elysia, t } from 'elysia'
import { ControllerError } from '../../src/http/schemas.ts'
import type { PodRecords } from './api.ts'
import {
  GpuAvailableSchema,
  InstanceDetailSchema,
  InstanceEventsQuerySchema,
  InstanceSchema,
  LoadBody,
  LoadResponseSchema,
  LogRecordSchema,
  LogsQuerySchema,
  MemoryUsageSchema,
  MultiGpuSchema,
  SleepQuerySchema,
  SleepResultSchema,
  SleepStatusSchema,
  UnloadResultSchema,
  WakeBodySchema,
  WakeResultSchema,
} from './schemas.ts'
import type { GatewayService } from './service.ts'
import { memoryUsageView } from './views.ts'

/**
 * gatewayRoutes: the controller routes of the lifecycle, GPU/memory and sleep sections. Thin: the
 * service decides, and the answers a cluster also relays from a pod are its `records` (records.ts).
 */
const tags = ['gateway']
const Errors = { 400: ControllerError, 404: ControllerError, 409: ControllerError, 502: ControllerError }

function basic<
  T extends { memory_metrics?: unknown; memory_baseline_by_gpu?: unknown; launch_command?: unknown },
>(r: T) {
  const { memory_metrics: _m, memory_baseline_by_gpu: _b, launch_command: _l, ...rest } = r
  return rest
}

export function gatewayRoutes(service: GatewayService, records: PodRecords, shmDir: string) {
  return new Elysia({ name: 'gateway-routes' })
    .post(
      '/api/v1/models/load',
      async ({ body, set }) => {
        set.status = 202
        return records.load(body)
      },
      {
        body: LoadBody,
        response: { 202: LoadResponseSchema, ...Errors, 507: ControllerError },
        detail: {
          tags,
          summary: 'Load a model (asynchronous)',
          description:
            'Validates, places on GPUs (most free memory first), allocates a port and spawns the engine; returns 202 ' +
            'with status `starting`. Watch the instance events for `active` or `failed`. 400 INSUFFICIENT_MEMORY when ' +
            'a GPU has less free memory than gpu_memory_utilization × its total; 409 MODEL_ALREADY_EXISTS when ' +
            'extra_args ask for a port an instance already uses. 507 INSUFFICIENT_STORAGE when the disk is full: ' +
            'an engine whose log dir or instance row cannot be written is not left running.',
        },
      },
    )
    .get(
      '/api/v1/models',
      () => {
        const models = service.list().map(basic)
        return { models, total: models.length }
      },
      {
        response: t.Object({ models: t.Array(InstanceSchema), total: t.Number() }),
        detail: { tags, summary: 'List model instances' },
      },
    )
    .get('/api/v1/models/:id', ({ params }) => ({ model: service.require(params.id).record() }), {
      params: t.Object({ id: t.String() }),
      response: { 200: t.Object({ model: InstanceDetailSchema }), 404: ControllerError },
      detail: { tags, summary: 'Model instance detail (memory metrics, baselines, launch command)' },
    })
    .post(
      '/api/v1/models/:id/unload',
      async ({ params, set }) => {
        const record = await records.unload(params.id)
        set.status = 202
        return record
      },
      {
        params: t.Object({ id: t.String() }),
        response: {
          202: UnloadResultSchema,
          404: ControllerError,
          409: ControllerError,
        },
        detail: {
          tags,
          summary: 'Unload a model (asynchronous)',
          description:
            'Status becomes `stopping`; the engine process group gets SIGTERM, then SIGKILL after ' +
            'plugins.gateway.engine.stop_grace_seconds; the instance disappears when the group is gone. ' +
            'A failed instance is removed the same way.',
        },
      },
    )
    .get(
      '/api/v1/models/instances/:instance_id/events',
      ({ params, query, request }) => records.events(params.instance_id, query, request.signal),
      {
        params: t.Object({ instance_id: t.String() }),
        query: InstanceEventsQuerySchema,
        detail: {
          tags,
          summary: 'Instance event stream (SSE)',
          description:
            'Each message: `event: <type>`, `data: {id, timestamp, instanceId, eventType, data}`. log: {stream, content}; ' +
            'status: {previousStatus, currentStatus, message} (currentStatus `removed` ends the stream); progress: ' +
            '{phase, percent, message} with phases starting, loading_weights, profiling, kv_cache, cuda_graphs, api_server, ' +
            'ready; memory: {gpu_ids, memory_used_gib_by_gpu, total_memory_used_gib, status, memory_metrics}; error: ' +
            '{message, source}. A late subscriber first gets the buffered logs (replay_logs) and the latest status, ' +
            'progress and memory events. Heartbeat comments every 15 s.',
        },
      },
    )
    .get(
      '/api/v1/models/instances/:instance_id/logs',
      ({ params, query }) => records.logs(params.instance_id, query),
      {
        params: t.Object({ instance_id: t.String() }),
        query: LogsQuerySchema,
        response: {
          200: LogRecordSchema,
          400: ControllerError,
          404: ControllerError,
        },
        detail: { tags, summary: 'Recent engine log lines, prefixed [stdout]/[stderr]' },
      },
    )
    .get('/api/gpu/available', () => records.gpuAvailable(), {
      response: { 200: GpuAvailableSchema, 503: ControllerError },
      detail: {
        tags,
        summary: 'GPUs and the recommended one (most free memory)',
        description:
          'Memory in MiB as nvidia-smi reports it; unknown values ([N/A]) are null. 503 without a GPU probe.',
      },
    })
    .get('/api/memory/usage', () => memoryUsageView(service, shmDir), {
      response: { 200: MemoryUsageSchema, 503: ControllerError },
      detail: {
        tags,
        summary: 'Memory usage, whole host',
        description:
          'All *_gb figures are GiB. KVCache Total = GPU Free + Prealloc + Used; KVCache Free = max(0, Total − Used − ' +
          'Prealloc). Used/prealloc come from the kvcached segments, else from each engine’s vllm:kv_cache_usage_perc × ' +
          'its KV cache. kvcache is omitted when no model is loaded.',
      },
    })
    .get('/api/memory/usage/multi-gpu', () => records.multiGpu(), {
      response: { 200: MultiGpuSchema, 503: ControllerError },
      detail: {
        tags,
        summary: 'Memory usage per GPU',
        description:
          'Per-GPU kvcache total = GPU Total − model baselines (memory_baseline_by_gpu) − other processes; TP models’ ' +
          'KV usage is split evenly over their GPUs.',
      },
    })
    .post(
      '/api/models/instances/:instance_id/sleep',
      ({ params, query }) => records.sleep(params.instance_id, query),
      {
        params: t.Object({ instance_id: t.String() }),
        query: SleepQuerySchema,
        response: { 200: SleepResultSchema, ...Errors },
        detail: {
          tags,
          summary: 'Put a running instance to sleep',
          description:
            'Level 1 offloads weights to CPU and discards the KV cache (~90% freed); level 2 discards both (~95%). ' +
            'No request is cut: new requests stop being routed to the instance (503 model_sleeping, or another ' +
            'instance of the model), the sleep waits for the requests in flight (up to drain_timeout_ms), then ' +
            "calls the engine's /sleep with mode=wait. Past the deadline: 409 SLEEP_DRAIN_TIMEOUT and the instance " +
            'keeps serving. Then nvidia-smi measures what the engine still holds per GPU: sleep_verified and ' +
            'memory_check say whether the level freed its share; when it did not, an error event, and ' +
            'plugins.gateway.sleep.verify_fallback (warn: stays asleep; unload: status stopping). ' +
            '400 SLEEP_MODE_NOT_ENABLED when loaded without enable_sleep_mode; 404; 409 when not running or busy ' +
            'with another operation; 502 when the engine fails.',
        },
      },
    )
    .post(
      '/api/models/instances/:instance_id/wake',
      ({ params, body }) => records.wake(params.instance_id, body ?? undefined),
      {
        params: t.Object({ instance_id: t.String() }),
        body: t.Optional(WakeBodySchema),
        response: { 200: WakeResultSchema, ...Errors },
        detail: {
          tags,
          summary: 'Wake a sleeping instance',
          description:
            'Optional body {tags: "weights" | "kv_cache" | [...]} wakes part of the engine; no tags wakes all. ' +
            "After level 2 the engine's weights are gone, so the wake runs vLLM's sequence: wake the weights, " +
            'POST /collective_rpc reload_weights, wake the KV cache, then POST /reset_prefix_cache once fully awake; ' +
            '`phases` lists what ran. The instance serves again only when every phase finished: a failure half-way ' +
            'answers 502 ENGINE_ERROR naming the phase, the instance stays sleeping (not routed) with an error ' +
            'event, sleep-status shows `wake.failed_phase`, and the next wake resumes after the phases that ' +
            'finished. 409 when not sleeping.',
        },
      },
    )
    .get(
      '/api/models/instances/:instance_id/sleep-status',
      ({ params }) => service.sleepStatus(params.instance_id),
      {
        params: t.Object({ instance_id: t.String() }),
        response: { 200: SleepStatusSchema, 404: ControllerError },
        detail: {
          tags,
          summary: 'Sleep status of an instance',
          description:
            "The instance's state and the engine's own /is_sleeping; `operation` and `in_flight` (a sleep that " +
            'drains shows operation `sleep`); the memory check of the last sleep (`sleep_verified`: true, false, ' +
            'or null when it could not be measured); `wake`: the phases woken since the last sleep and where the ' +
            'last wake failed.',
        },
      },
    )
}
