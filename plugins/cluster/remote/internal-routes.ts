import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import {
  type GatewayPodApi,
  GpuAvailableSchema,
  InstanceEventsQuerySchema,
  LoadBody,
  LoadResponseSchema,
  LogRecordSchema,
  LogsQuerySchema,
  MultiGpuSchema,
  SleepQuerySchema,
  SleepResultSchema,
  UnloadResultSchema,
  WakeBodySchema,
  WakeResultSchema,
} from '../../gateway/api.ts'
import { termAdmission } from '../internal-routes.ts'
import type { TermFence } from '../term.ts'
import { gpuInfo, modelsFull } from './pod-views.ts'
import { GpuInfoSchema, ModelsFullSchema } from './schemas.ts'

/**
 * remoteInternalRoutes: the Internal API's remote lifecycle, what a peer's cluster API calls. Each acts
 * on this pod's own gateway only (never a second hop) and answers with its records
 * (GatewayPodApi.records): the very record, from the very inputs, of the gateway's own route.
 */
const tags = ['internal']
const Errors = {
  400: ControllerError,
  401: ControllerError,
  404: ControllerError,
  409: ControllerError,
  503: ControllerError,
}
const Id = t.Object({ id: t.String({ maxLength: 256 }) })

export function remoteInternalRoutes(gateway: GatewayPodApi, fence: TermFence) {
  const records = gateway.records
  return new Elysia({ name: 'cluster-remote-internal-routes' })
    .use(termAdmission(fence))
    .post('/internal/models/load', ({ body }) => records.load(body), {
      body: LoadBody,
      response: { 200: LoadResponseSchema, ...Errors },
      detail: { tags, summary: "Remote model load on this pod (the gateway's load body)" },
    })
    .post('/internal/models/:id/unload', ({ params }) => records.unload(params.id), {
      params: Id,
      response: { 200: UnloadResultSchema, ...Errors },
      detail: { tags, summary: 'Remote unload' },
    })
    .post('/internal/models/:id/sleep', ({ params, query }) => records.sleep(params.id, query), {
      params: Id,
      query: SleepQuerySchema,
      response: { 200: SleepResultSchema, ...Errors },
      detail: { tags, summary: 'Remote sleep (drains first, as the single-pod sleep)' },
    })
    .post('/internal/models/:id/wake', ({ params, body }) => records.wake(params.id, body ?? undefined), {
      params: Id,
      body: t.Optional(WakeBodySchema),
      response: { 200: WakeResultSchema, ...Errors },
      detail: { tags, summary: 'Remote wake' },
    })
    .get(
      '/internal/models/:id/events',
      ({ params, query, request }) => records.events(params.id, query, request.signal),
      {
        params: Id,
        query: InstanceEventsQuerySchema,
        detail: { tags, summary: "SSE relay of an instance's events (load progress, status, logs)" },
      },
    )
    .get('/internal/models/:id/logs', ({ params, query }) => records.logs(params.id, query), {
      params: Id,
      query: LogsQuerySchema,
      response: { 200: LogRecordSchema, ...Errors },
      detail: { tags, summary: 'Process logs of an instance' },
    })
    .get('/internal/models', () => modelsFull(gateway), {
      response: { 200: ModelsFullSchema, ...Errors },
      detail: { tags, summary: 'Full model instance list of this pod' },
    })
    .get('/internal/gpu/available', () => records.gpuAvailable(), {
      response: { 200: GpuAvailableSchema, ...Errors },
      detail: { tags, summary: 'GPU availability of this pod' },
    })
    .get('/internal/gpu/info', () => gpuInfo(gateway), {
      response: { 200: GpuInfoSchema, ...Errors },
      detail: { tags, summary: 'Full GPU driver info of this pod' },
    })
    .get('/internal/memory/multi-gpu', () => records.multiGpu(), {
      response: { 200: MultiGpuSchema, ...Errors },
      detail: { tags, summary: 'Multi-GPU memory usage of this pod' },
    })
}
