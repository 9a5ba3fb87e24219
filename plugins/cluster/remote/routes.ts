import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import { LogsQuerySchema, WakeBodySchema } from '../../gateway/api.ts'
import {
  ClusterLoadBody,
  ClusterLoadResultSchema,
  ClusterLogRecordSchema,
  ClusterSleepBody,
  ClusterSleepResultSchema,
  ClusterUnloadResultSchema,
  ClusterWakeResultSchema,
  EventsQuery,
  PodGpuAvailableSchema,
  PodGpuInfoSchema,
  PodMemorySchema,
  PodModelsFullSchema,
} from './schemas.ts'
import type { RemoteLifecycle } from './service.ts'

/**
 * remoteRoutes: the cluster API's lifecycle and per-pod views (admin JWT). Each runs on the pod that
 * holds the instance, or the pod named: this pod's own through its gateway, another's over one
 * signed hop to its /internal routes. Every answer is the single-pod record the owning pod's gateway
 * gives, plus `podId`.
 */
const tags = ['cluster']
const Errors = {
  400: ControllerError,
  401: ControllerError,
  403: ControllerError,
  404: ControllerError,
  409: ControllerError,
  502: ControllerError,
  503: ControllerError,
  504: ControllerError,
}
const Instance = t.Object({ instanceId: t.String({ maxLength: 256 }) })
const Pod = t.Object({ podId: t.String({ maxLength: 253 }) })
const PEER_ERRORS =
  ' A peer that cannot be reached is 502 PEER_UNREACHABLE (a peer refusing the signature 502 PEER_REFUSED), ' +
  'one past plugins.cluster.request_timeout_ms 504 PEER_TIMEOUT; the owning pod’s own refusals come back ' +
  'with their status and code.'

export function remoteRoutes(remote: RemoteLifecycle) {
  return new Elysia({ name: 'cluster-remote-routes' })
    .post('/api/cluster/models/load', ({ body }) => remote.load(body), {
      body: ClusterLoadBody,
      response: { 200: ClusterLoadResultSchema, ...Errors },
      detail: {
        tags,
        summary: 'Load a model on a pod (targetPodId, default this one)',
        description:
          "200: the target pod's load response (status starting, as POST /api/v1/models/load answers it) plus " +
          'podId. Follow it with GET /api/cluster/models/{instance_id}/events. 404 POD_NOT_FOUND for an unknown ' +
          'targetPodId.' +
          PEER_ERRORS,
      },
    })
    .post('/api/cluster/models/:instanceId/unload', ({ params }) => remote.unload(params.instanceId), {
      params: Instance,
      response: { 200: ClusterUnloadResultSchema, ...Errors },
      detail: {
        tags,
        summary: 'Unload an instance from whichever pod holds it',
        description: `200: {status: stopping, instance_id, message, podId}. 404 INSTANCE_NOT_FOUND when no pod holds it.${PEER_ERRORS}`,
      },
    })
    .post(
      '/api/cluster/models/:instanceId/sleep',
      ({ params, body }) => remote.sleep(params.instanceId, body.level ?? 1, body.drainTimeoutMs),
      {
        params: Instance,
        body: ClusterSleepBody,
        response: { 200: ClusterSleepResultSchema, ...Errors },
        detail: {
          tags,
          summary: 'Sleep an instance on whichever pod holds it',
          description:
            'As the single-pod sleep on the owning pod (drain first, never cutting a request; level default 1): its sleep result plus podId.' +
            PEER_ERRORS,
        },
      },
    )
    .post(
      '/api/cluster/models/:instanceId/wake',
      ({ params, body }) => remote.wake(params.instanceId, body.tags),
      {
        params: Instance,
        body: WakeBodySchema,
        response: { 200: ClusterWakeResultSchema, ...Errors },
        detail: {
          tags,
          summary: 'Wake an instance on whichever pod holds it',
          description: `As the single-pod wake on the owning pod: its wake result plus podId.${PEER_ERRORS}`,
        },
      },
    )
    .get(
      '/api/cluster/models/:instanceId/logs',
      ({ params, query }) => remote.logs(params.instanceId, query.lines ?? 100),
      {
        params: Instance,
        query: LogsQuerySchema,
        response: { 200: ClusterLogRecordSchema, ...Errors },
        detail: {
          tags,
          summary: "An instance's engine log lines from the pod that holds it (lines 1–500, default 100)",
        },
      },
    )
    .get(
      '/api/cluster/models/:instanceId/events',
      ({ params, query, request }) => remote.events(params.instanceId, query, query.podId, request.signal),
      {
        params: Instance,
        query: EventsQuery,
        detail: {
          tags,
          summary: "An instance's event stream (SSE), relayed from the pod that holds it",
          description:
            'The single-pod stream of the owning pod, byte for byte (podId is a hint tried first). It ends when the ' +
            'owning pod ends it or the client leaves (which closes the relay to the pod).',
        },
      },
    )
    .get('/api/cluster/pods/:podId/gpu/available', ({ params }) => remote.gpuAvailable(params.podId), {
      params: Pod,
      response: { 200: PodGpuAvailableSchema, ...Errors },
      detail: { tags, summary: "That pod's GPU availability (its GET /api/gpu/available, plus podId)" },
    })
    .get('/api/cluster/pods/:podId/memory', ({ params }) => remote.memory(params.podId), {
      params: Pod,
      response: { 200: PodMemorySchema, ...Errors },
      detail: { tags, summary: "That pod's memory usage (its GET /api/memory/usage/multi-gpu, plus podId)" },
    })
    .get('/api/cluster/pods/:podId/gpu/info', ({ params }) => remote.gpuInfo(params.podId), {
      params: Pod,
      response: { 200: PodGpuInfoSchema, ...Errors },
      detail: { tags, summary: "That pod's full GPU driver info (nvidia-smi's GPUs and processes)" },
    })
    .get('/api/cluster/pods/:podId/models/full', ({ params }) => remote.modelsFull(params.podId), {
      params: Pod,
      response: { 200: PodModelsFullSchema, ...Errors },
      detail: { tags, summary: "That pod's full model instance records ({models, total, podId})" },
    })
}
