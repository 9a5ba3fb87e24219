import { Elysia, t } from 'elysia'
import { ControllerError } from '../../src/http/schemas.ts'
import { sseResponse } from '../../src/http/sse.ts'
import { METRIC_DOCS, STATUS_DOCS } from './docs.ts'
import { EVENT_DOCS } from './events.ts'
import { BUNDLE_VERSION, type Bundle, BundleSchema, ImportResultSchema } from './export.ts'
import { CreateRunSchema, RunSchema, RunStatusSchema, RunSummarySchema } from './schemas.ts'
import type { BenchmarkService } from './service.ts'

/**
 * benchmarkRoutes: the benchmark endpoints, plus cancel and export/import. Thin: every
 * decision lives in BenchmarkService.
 */
const tags = ['benchmarks']
const IdParams = t.Object({ id: t.String({ minLength: 1 }) })
const RunEnvelope = t.Object({ benchmark: RunSchema })
const errors = { 400: ControllerError, 404: ControllerError, 409: ControllerError }

export function benchmarkRoutes(service: BenchmarkService) {
  return new Elysia({ name: 'benchmarks' }).group('/api/benchmarks', (g) =>
    g
      .post(
        '',
        ({ body, set }) => {
          set.status = 201
          return { benchmark: service.create(body) }
        },
        {
          body: CreateRunSchema,
          response: { 201: RunEnvelope, 400: ControllerError, 409: ControllerError, 503: ControllerError },
          detail: {
            tags,
            summary: 'Create a benchmark run',
            description:
              'Validates every scenario (the instance exists and is active; inputTokens + outputTokens ≤ the ' +
              "instance's max_tokens, else 400 VALIDATION_ERROR naming the scenario; positive integers; " +
              'concurrency ≤ 4096, totalRequests ≤ 100000, warmupRequests ≤ 10000, at most 32 scenarios), stores ' +
              'the run and answers 201 with the pending run; the run starts in the background. `routingMode` ' +
              'defaults to direct. Optional: `requestRate` (open loop), `slaTtftMs` and `slaTpotMs`. 409 ' +
              `BENCHMARK_QUEUE_FULL when max_queued_runs runs already wait.\n\n${STATUS_DOCS}\n\n${METRIC_DOCS}`,
          },
        },
      )
      .get(
        '',
        ({ query }) => {
          const page = query.page ?? 1
          const limit = Math.min(100, query.limit ?? 20)
          const { benchmarks, total } = service.list(page, limit, query.status)
          return { benchmarks, total, page, limit }
        },
        {
          query: t.Object({
            page: t.Optional(t.Integer({ minimum: 1, default: 1, description: 'page number, from 1' })),
            limit: t.Optional(
              t.Integer({
                minimum: 1,
                default: 20,
                description: 'page size; values above 100 are capped at 100',
              }),
            ),
            status: t.Optional(RunStatusSchema),
          }),
          response: {
            200: t.Object({
              benchmarks: t.Array(RunSummarySchema),
              total: t.Integer({ description: 'runs matching the filter' }),
              page: t.Integer(),
              limit: t.Integer({ description: 'the page size used' }),
            }),
            400: ControllerError,
          },
          detail: {
            tags,
            summary: 'List benchmark runs',
            description:
              'Newest first. A summary is the run without its scenarios, plus scenario_count and model_names.',
          },
        },
      )
      .get('/export', () => service.exportBundle(), {
        response: { 200: BundleSchema },
        detail: {
          tags,
          summary: 'Export finished runs',
          description:
            `A versioned JSON bundle (format "modelgate.benchmarks", version ${BUNDLE_VERSION}) with every ` +
            'completed, cancelled and failed run, whole (scenarios and metrics, in the GET /api/benchmarks/{id} ' +
            'shape), oldest first. Pending and running runs are left out.',
        },
      })
      .post('/import', ({ body }) => service.importBundle(body as Bundle), {
        body: BundleSchema,
        response: { 200: ImportResultSchema, 400: ControllerError },
        detail: {
          tags,
          summary: 'Import a bundle',
          description:
            'Stores the runs of an export bundle with their ids. Runs that already exist (or whose scenario ids ' +
            'exist) are skipped and listed with the reason; runs that are not finished are skipped. 400 for an ' +
            'unknown format or version.',
        },
      })
      .get('/:id', ({ params }) => ({ benchmark: service.get(params.id) }), {
        params: IdParams,
        response: { 200: RunEnvelope, 404: ControllerError },
        detail: {
          tags,
          summary: 'Get a benchmark run with scenarios and metrics',
          description: `Scenario \`metrics\` are present once a scenario completed (or was cancelled after some requests finished).\n\n${METRIC_DOCS}\n\n${STATUS_DOCS}`,
        },
      })
      .get(
        '/:id/events',
        ({ params, request }) => {
          const events = service.events(params.id)
          return sseResponse(
            (sink) => events.subscribe((e) => sink.send(e.event, e.data), { onEnd: () => sink.close() }),
            { signal: request.signal },
          )
        },
        {
          params: IdParams,
          response: {
            200: t.String({
              description: 'text/event-stream: `event: <name>` and `data: <JSON>` per message',
            }),
            404: ControllerError,
          },
          detail: {
            tags,
            summary: 'Benchmark progress stream (SSE)',
            description: `Server-Sent Events; each message has the event name and a JSON data line. Heartbeat comments keep quiet streams open. Browsers may pass the JWT as query parameter \`token\`.\n\n${EVENT_DOCS}`,
          },
        },
      )
      .post('/:id/cancel', async ({ params }) => ({ benchmark: await service.cancel(params.id) }), {
        params: IdParams,
        response: { 200: RunEnvelope, ...errors },
        detail: {
          tags,
          summary: 'Cancel a benchmark run',
          description:
            'Aborts in-flight requests and answers with the run once it is cancelled (a pending run is cancelled ' +
            'before it starts). 409 BENCHMARK_NOT_ACTIVE when the run already finished.',
        },
      })
      .delete('/:id', async ({ params }) => service.delete(params.id), {
        params: IdParams,
        response: {
          200: t.Object({
            id: t.String(),
            deleted: t.Literal(true),
            cancelled: t.Boolean({
              description: 'true when the run was pending or running and was cancelled first',
            }),
          }),
          404: ControllerError,
        },
        detail: {
          tags,
          summary: 'Delete a benchmark run',
          description:
            'Deletes the run and its scenarios. A pending or running run is cancelled first (its event stream ends ' +
            'with benchmark:cancelled).',
        },
      }),
  )
}
