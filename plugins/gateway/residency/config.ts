import { type Static, Type as T } from '@sinclair/typebox'

/**
 * ResidencyConfig is `plugins.gateway.residency`: how this host keeps the models of its catalogue
 * resident in GPU memory (residency/manager.ts). `policy: off` keeps today's behaviour: nothing is
 * loaded or evicted on its own.
 */
export const ResidencyConfig = T.Object(
  {
    policy: T.Union([T.Literal('cost'), T.Literal('lru'), T.Literal('lru-sleep'), T.Literal('off')], {
      default: 'cost',
      description:
        'how room is made for a model that must load or wake: cost (the actions that free enough memory at the ' +
        'least expected cost: chance of use within the horizon × time to bring it back), lru (unload the least ' +
        'recently used), lru-sleep (the least recently used sleeps at level 1 while host RAM allows, else it is ' +
        'unloaded), off (never evict; a catalogued model loads only where memory is free)',
    }),
    max_queue: T.Integer({
      default: 1024,
      minimum: 1,
      description:
        'requests held per model while it loads or wakes; beyond it 429 queue_full with Retry-After. ' +
        'One inference key holds at most half of it (at least 1), or its max_concurrent when that is more. ' +
        'A burst during a cold load waits rather than fails: what a held request holds (its connection and ' +
        "its body) counts against the listener's server.max_connections and server.max_buffered_body_bytes, " +
        'so the queue adds only its own small entry per request to what the listener already bounds',
    }),
    queue_timeout_seconds: T.Integer({
      default: 300,
      minimum: 1,
      description: 'a held request waits this long for its model, then 503 naming what the load is doing',
    }),
    min_resident_seconds: T.Integer({
      default: 0,
      minimum: 0,
      description:
        'a model is never a victim until it has served this long since it became resident. 0 (the default): ' +
        'the cost policy weighs how likely each model is to be asked for again, which keeps a busy model, and ' +
        'a floor only makes other requests wait (bench:residency: 60 s failed 1,200-1,900 requests of 24 traces)',
    }),
    host_memory_budget_gib: T.Number({
      default: 64,
      minimum: 0,
      description:
        'host RAM the weights of models asleep at level 1 may take in all (level 1 parks them there)',
    }),
    horizon_seconds: T.Integer({
      default: 600,
      minimum: 1,
      description: 'how far ahead the cost policy weighs the chance that a victim is asked for again',
    }),
    rate_window_seconds: T.Integer({
      default: 600,
      minimum: 1,
      description: "a model's request rate is its requests over this last window",
    }),
  },
  {
    additionalProperties: false,
    default: {},
    description: 'how the catalogue is kept resident in GPU memory (loaded on demand, evicted by policy)',
  },
)

export type ResidencyConfig = Static<typeof ResidencyConfig>
