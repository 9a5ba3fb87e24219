import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import type { PresetDetail, PresetSyncResult } from '../../gateway/api.ts'
import { PresetDetailSchema } from '../../gateway/api.ts'
import { termAdmission } from '../internal-routes.ts'
import type { TermFence } from '../term.ts'
import type { PresetPlacement } from './service.ts'

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

const PlacedSchema = t.Object({
  modelPath: t.String(),
  servedModelName: t.String(),
  podId: t.String(),
  gpuIds: t.Array(t.Number()),
  reason: t.String({ description: 'why this pod and these GPUs, with the figures' }),
  status: t.Union([t.Literal('kept'), t.Literal('loading'), t.Literal('queued'), t.Literal('planned')], {
    description:
      'kept: already there; loading: started on its pod; queued: starts once the entry before it on the same ' +
      'GPU is active; planned: a dry run',
  }),
  instanceId: t.Nullable(
    t.String({ description: 'the instance (kept or started); null when queued or planned' }),
  ),
})

export const ApplyResultSchema = t.Object({
  presetId: t.String(),
  presetName: t.String(),
  dryRun: t.Boolean(),
  placed: t.Array(PlacedSchema),
  unplaceable: t.Array(t.Object({ modelPath: t.String(), servedModelName: t.String(), reason: t.String() })),
  unloaded: t.Array(
    t.Object({ modelPath: t.String(), podId: t.String(), instanceId: t.String(), reason: t.String() }),
  ),
})

export function placementRoutes(placement: PresetPlacement) {
  return new Elysia({ name: 'cluster-placement-routes' }).post(
    '/api/cluster/presets/:presetId/apply',
    ({ params, body }) => placement.apply(params.presetId, body?.dryRun ?? false),
    {
      params: t.Object({ presetId: t.String({ maxLength: 256 }) }),
      body: t.Optional(t.Object({ dryRun: t.Optional(t.Boolean()) }, { additionalProperties: false })),
      response: { 200: ApplyResultSchema, ...Errors },
      detail: {
        tags,
        summary: 'Apply a preset to the whole cluster, with automatic pod and GPU placement (leader only)',
        description:
          'The leader compares the preset with every healthy pod: an instance of an entry (same model path and ' +
          'served name) is kept; every other instance is unloaded; the rest are placed in load order, each on ' +
          'the GPUs the preset names when some pod has them with room, else on the tensorParallelSize GPUs of ' +
          'one pod that fit it most tightly (best fit), room being free memory (after the unloads and earlier ' +
          'placements) against the gateway’s estimate (a measured profile, else gpu_memory_utilization × the ' +
          'device). dryRun: true changes nothing and gives the same answer for the same state. Otherwise the ' +
          'unloads finish first, then each placed entry loads on its pod; entries sharing a GPU load one after ' +
          'another (queued), the first of each is started before this answers. Follow them with the cluster’s ' +
          'instance events. 404 CONFIGURATION_NOT_FOUND (presets are the leader’s, synced to every pod); 409 ' +
          'NOT_LEADER on a follower (naming the leader, where to retry); 503 NO_LEADER; 409 APPLY_IN_PROGRESS ' +
          'while an earlier apply still loads; 504 UNLOAD_TIMEOUT when the unloads do not finish (nothing loaded).',
      },
    },
  )
}

export function presetSyncInternalRoutes(
  sync: (presets: PresetDetail[]) => PresetSyncResult,
  fence: TermFence,
) {
  return new Elysia({ name: 'cluster-presets-internal-routes' })
    .use(termAdmission(fence))
    .post('/internal/presets/sync', ({ body }) => sync(body.presets as PresetDetail[]), {
      body: t.Object({ presets: t.Array(PresetDetailSchema, { maxItems: 10_000 }) }),
      response: {
        200: t.Object({
          created: t.Integer(),
          updated: t.Integer(),
          unchanged: t.Integer(),
          conflicts: t.Array(t.Object({ id: t.String(), name: t.String(), reason: t.String() })),
        }),
        400: ControllerError,
        401: ControllerError,
        409: ControllerError,
      },
      detail: {
        tags: ['internal'],
        summary: 'Presets from the leader: each upserted by id when newer; none deleted',
        description:
          '200: {created, updated, unchanged, conflicts[{id, name, reason}]}; a preset whose name another preset ' +
          'on this pod has is left out (conflicts). 409 STALE_TERM from a deposed leader.',
      },
    })
}
