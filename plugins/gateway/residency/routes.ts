import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import type { ResidencyManager } from './manager.ts'

/**
 * GET /api/residency: what the residency manager keeps resident and why: its policy and host-RAM
 * budget, each catalogued model's state with what it would cost to bring back after each way of
 * freeing it, and the last decisions with their victims and the candidates they passed over.
 */
const Action = t.Union([t.Literal('sleep1'), t.Literal('sleep2'), t.Literal('unload')])

export const ResidencyModelSchema = t.Object({
  name: t.String(),
  state: t.Union(
    [
      t.Literal('absent'),
      t.Literal('loading'),
      t.Literal('active'),
      t.Literal('sleeping'),
      t.Literal('waking'),
      t.Literal('unloading'),
      t.Literal('failed'),
    ],
    { description: 'absent: no instance here; the others: its instance’s state' },
  ),
  instance_id: t.Nullable(t.String()),
  pinned: t.Boolean(),
  evictable_now: t.Boolean(),
  why_not_evictable: t.Nullable(t.String()),
  last_request_at: t.Nullable(t.String()),
  request_rate_per_min: t.Number({ description: 'over the last 10 minutes' }),
  queue_length: t.Integer({ description: 'requests waiting for it now' }),
  footprint_gib: t.Nullable(t.Number({ description: 'per GPU, measured (null: never measured)' })),
  gpu_ids: t.Array(t.Integer()),
  costs: t.Object({
    wake_l1_s: t.Number(),
    wake_l2_s: t.Number(),
    load_s: t.Number(),
    measured: t.Object({ wake_l1: t.Boolean(), wake_l2: t.Boolean(), load: t.Boolean() }),
  }),
})

export const ResidencyDecisionSchema = t.Object({
  at: t.String(),
  trigger: t.Object({
    model: t.String(),
    need_gib: t.Number(),
    gpu_ids: t.Array(t.Integer()),
    kind: t.Union([t.Literal('load'), t.Literal('wake')]),
  }),
  victims: t.Array(
    t.Object({
      model: t.String(),
      instance_id: t.String(),
      action: Action,
      freed_gib: t.Number(),
      expected_cost_s: t.Number(),
    }),
  ),
  rejected: t.Array(
    t.Object({ model: t.String(), instance_id: t.String(), action: t.Nullable(Action), reason: t.String() }),
  ),
  reason: t.String(),
})

export const ResidencySchema = t.Object({
  policy: t.Union([t.Literal('cost'), t.Literal('lru'), t.Literal('lru-sleep'), t.Literal('off')]),
  active: t.Boolean({ description: 'the manager runs: the catalogue has entries' }),
  host_memory: t.Object({ budget_gib: t.Number(), used_gib: t.Number() }),
  models: t.Array(ResidencyModelSchema),
  decisions: t.Array(ResidencyDecisionSchema),
})

export function residencyRoutes(manager: ResidencyManager) {
  return new Elysia({ name: 'gateway-residency-routes' }).get('/api/residency', () => manager.view(), {
    response: { 200: ResidencySchema, 401: ControllerError },
    detail: {
      tags: ['gateway'],
      summary:
        'What is resident in GPU memory, what each catalogued model costs to bring back, and recent decisions',
      description:
        'Each catalogued model: its state here, instance, pin, last request and request rate, requests queued ' +
        'for it, footprint, the measured (or, before any measurement, published) time to bring it back after a ' +
        'level-1 sleep, a level-2 sleep or an unload, and whether it may be a victim now (and why not). ' +
        'decisions: the last 50, newest first: what needed room, which instances slept or were unloaded, what ' +
        'each freed and was expected to cost, and which were passed over.',
    },
  })
}
