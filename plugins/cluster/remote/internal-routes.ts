import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import {
  GpuAvailableSchema,
  LoadBody,
  LoadResponseSchema,
  MultiGpuSchema,
  SleepResultSchema,
  WakeResultSchema,
} from '../../gateway/api.ts'
import { termAdmission } from '../internal-routes.ts'
import type { TermFence } from '../term.ts'
import type { LocalPod } from './local-pod.ts'
import {
  EventsQuery,
  GpuInfoSchema,
  LogRecordSchema,
  LogsQuery,
  ModelsFullSchema,
  UnloadResultSchema,
  WakeBody,
} from './schemas.ts'

/**
 * remoteInternalRoutes: the Internal API's remote lifecycle, what a peer's cluster API calls. Each acts
 * on this pod's own gateway only (never a second hop) and answers the single-pod record.
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

export function remoteInternalRoutes(local: LocalPod, fence: TermFence) {
  return new Elysia({ name: 'cluster-remote-internal-routes' })
    .use(termAdmission(fence))
    .post('/internal/models/load', ({ body }) => local.load(body), {
      body: LoadBody,
      response: { 200: LoadResponseSchema, ...Errors },
      detail: { tags, summary: "Remote model load on this pod (the gateway's load body)" },
    })
    .post('/internal/models/:id/unload', ({ params }) => local.unload(params.id), {
      params: Id,
      response: { 200: UnloadResultSchema, ...Errors },
      detail: { tags, summary: 'Remote unload' },
    })
    .post(
      '/internal/models/:id/sleep',
      ({ params, query }) => local.sleep(params.id, (query.level ?? 1) as 1 | 2, query.drain_timeout_ms),
      {
        params: Id,
        query: t.Object({
          level: t.Optional(t.Numeric({ minimum: 1, maximum: 2, multipleOf: 1 })),
          drain_timeout_ms: t.Optional(t.Numeric({ minimum: 0, maximum: 86_400_000, multipleOf: 1 })),
        }),
        response: { 200: SleepResultSchema, ...Errors },
        detail: { tags, summary: 'Remote sleep (drains first, as the single-pod sleep)' },
      },
    )
    .post('/internal/models/:id/wake', ({ params, body }) => local.wake(params.id, body.tags), {
      params: Id,
      body: WakeBody,
      response: { 200: WakeResultSchema, ...Errors },
      detail: { tags, summary: 'Remote wake' },
    })
    .get(
      '/internal/models/:id/events',
      ({ params, query, request }) => local.events(params.id, query, request.signal),
      {
        params: Id,
        query: EventsQuery,
        detail: { tags, summary: "SSE relay of an instance's events (load progress, status, logs)" },
      },
    )
    .get('/internal/models/:id/logs', ({ params, query }) => local.logs(params.id, query.lines ?? 100), {
      params: Id,
      query: LogsQuery,
      response: { 200: LogRecordSchema, ...Errors },
      detail: { tags, summary: 'Process logs of an instance' },
    })
    .get('/internal/models', () => local.models(), {
      response: { 200: ModelsFullSchema, ...Errors },
      detail: { tags, summary: 'Full model instance list of this pod' },
    })
    .get('/internal/gpu/available', () => local.gpuAvailable(), {
      response: { 200: GpuAvailableSchema, ...Errors },
      detail: { tags, summary: 'GPU availability of this pod' },
    })
    .get('/internal/gpu/info', () => local.gpuInfo(), {
      response: { 200: GpuInfoSchema, ...Errors },
      detail: { tags, summary: 'Full GPU driver info of this pod' },
    })
    .get('/internal/memory/multi-gpu', () => local.memory(), {
      response: { 200: MultiGpuSchema, ...Errors },
      detail: { tags, summary: 'Multi-GPU memory usage of this pod' },
    })
}
