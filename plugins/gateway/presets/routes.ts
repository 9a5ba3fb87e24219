import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import { sseResponse } from '../../../src/http/sse.ts'
import { PresetDetailSchema, PresetSummarySchema as Summary } from '../schemas.ts'
import type { PresetService } from './service.ts'

/**
 * presetRoutes: the configuration (preset) endpoints, plus an SSE stream of preset-load
 * progress for dashboards. Thin: PresetService decides.
 */
const tags = ['gateway']
const IdParams = t.Object({ id: t.String() })

const LOAD_DOCS =
  'Answers 202 at once and works in the background: unload every current model (any status) and wait until ' +
  'they are gone (deadline: stop grace + 30 s); then load the entries with their GPUs, context length, ' +
  'extra_args, sleep mode and utilization. Entries sharing a GPU (also transitively, through tensor-parallel ' +
  'entries) load one after another in loadOrder, each waiting until active or failed; entries on disjoint GPUs ' +
  'load in parallel. An entry that is refused or fails is counted and the next one proceeds; the memory-profile ' +
  'pre-load check applies as for any load. Progress: the instances’ own event streams, and ' +
  '`gateway.preset.progress` events (GET /api/configurations/events). 404 CONFIGURATION_NOT_FOUND; ' +
  '409 CONFIGURATION_LOAD_IN_PROGRESS while another configuration is loading.'

export function presetRoutes(presets: PresetService) {
  return new Elysia({ name: 'gateway-preset-routes' }).group('/api/configurations', (g) =>
    g
      .get(
        '',
        () => {
          const configurations = presets.list()
          return { configurations, total: configurations.length }
        },
        {
          response: t.Object({ configurations: t.Array(Summary), total: t.Number() }),
          detail: { tags, summary: 'List configurations (newest first)' },
        },
      )
      .post(
        '',
        ({ body, set }) => {
          const { id, name, description, modelCount, createdAt } = presets.save(body)
          set.status = 201
          return { configuration: { id, name, description, modelCount, createdAt } }
        },
        {
          body: t.Object(
            {
              name: t.String({ minLength: 1, maxLength: 200 }),
              description: t.Optional(t.String({ maxLength: 2000 })),
            },
            { additionalProperties: false },
          ),
          response: {
            201: t.Object({
              configuration: t.Object({
                id: t.String(),
                name: t.String(),
                description: t.Nullable(t.String()),
                modelCount: t.Number(),
                createdAt: t.String(),
              }),
            }),
            400: ControllerError,
            409: ControllerError,
          },
          detail: {
            tags,
            summary: 'Save the running models as a configuration',
            description:
              'Body {name, description?}. Saves every active or sleeping instance (model path, served name, ' +
              'context length, GPUs, tensor parallelism, extra_args, sleep mode, utilization) in the order they ' +
              'were loaded. 400 VALIDATION_ERROR without a name; 400 NO_RUNNING_MODELS when nothing runs; ' +
              '409 CONFIGURATION_EXISTS when the name is taken (names compare case-insensitively).',
          },
        },
      )
      .get(
        '/events',
        ({ request }) =>
          sseResponse((sink) => presets.progress.subscribe((e) => sink.send('preset_progress', e)), {
            signal: request.signal,
          }),
        {
          query: t.Object({
            token: t.Optional(
              t.String({ description: 'admin JWT for browsers (EventSource cannot set headers)' }),
            ),
          }),
          detail: {
            tags,
            summary: 'Configuration load progress (SSE)',
            description:
              'Event `preset_progress`, data {configId, configName, phase (unloading | loading | completed | ' +
              'failed), loaded, failed, total, message, modelPath?, instanceId?}. A new client first gets the latest ' +
              'event (the state of the running or last load), then the rest live.',
          },
        },
      )
      .get('/:id', ({ params }) => ({ configuration: presets.detail(params.id) }), {
        params: IdParams,
        response: { 200: t.Object({ configuration: PresetDetailSchema }), 404: ControllerError },
        detail: { tags, summary: 'A configuration with its entries' },
      })
      .post(
        '/:id/load',
        ({ params, set }) => {
          const started = presets.startLoad(params.id)
          set.status = 202
          return started
        },
        {
          params: IdParams,
          response: {
            202: t.Object({
              status: t.Literal('started'),
              configId: t.String(),
              configName: t.String(),
              modelCount: t.Number(),
            }),
            404: ControllerError,
            409: ControllerError,
          },
          detail: { tags, summary: 'Load a configuration (asynchronous)', description: LOAD_DOCS },
        },
      )
      .delete(
        '/:id',
        ({ params }) => {
          presets.delete(params.id)
          return { deleted: true as const, id: params.id }
        },
        {
          params: IdParams,
          response: { 200: t.Object({ deleted: t.Literal(true), id: t.String() }), 404: ControllerError },
          detail: {
            tags,
            summary: 'Delete a configuration',
            description: '404 CONFIGURATION_NOT_FOUND. Running models are not touched.',
          },
        },
      ),
  )
}
