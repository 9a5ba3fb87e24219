import { t } from 'elysia'

/**
 * Response shapes of the router's routes, for /docs. They are the router API's resources;
 * timestamps are ISO 8601 strings and durations seconds.
 */
const Timestamp = t.String({ format: 'date-time', description: 'ISO 8601 (UTC)' })
const NullableTimestamp = t.Union([Timestamp, t.Null()], {
  description: 'ISO 8601 (UTC); null when the model has had no traffic since the router started',
})
const Seconds = (description: string) => t.Number({ description })

export const RouterError = t.Object(
  { error: t.Object({ message: t.String(), type: t.String(), code: t.String() }) },
  { description: 'Error shape of every router route' },
)

const EndpointSchema = t.Object({ host: t.String(), port: t.Integer() })

export const ModelEntrySchema = t.Object({
  id: t.String({ description: 'model name' }),
  object: t.Literal('model'),
  created: t.Integer({ description: 'Unix seconds' }),
  owned_by: t.String(),
  endpoint: EndpointSchema,
})

export const ModelListSchema = t.Object({ object: t.Literal('list'), data: t.Array(ModelEntrySchema) })

export const IdleModelsSchema = t.Object({
  idle_models: t.Array(
    t.Object({
      model: t.String(),
      idle_time: Seconds('seconds since the last activity (since the router started if none)'),
      last_activity: NullableTimestamp,
    }),
  ),
  threshold: t.Integer(),
})

export const ActiveModelsSchema = t.Object({
  active_models: t.Array(
    t.Object({
      model: t.String(),
      last_activity: NullableTimestamp,
      seconds_since_activity: Seconds('0 while requests are in flight'),
      request_count: t.Integer({ description: 'requests that ended within the window' }),
    }),
  ),
  threshold: t.Integer(),
})

const trafficFields = {
  total_requests: t.Integer(),
  successful_requests: t.Integer({ description: 'responses with a 2xx status' }),
  failed_requests: t.Integer({ description: 'everything else, refusals and client aborts included' }),
  request_rate: t.Number({ description: 'requests per minute over the window (or since start)' }),
  avg_response_time: Seconds('mean full duration (last byte of a stream), seconds'),
}

export const OverallTrafficSchema = t.Object(trafficFields)

export const ModelTrafficSchema = t.Object({ ...trafficFields, last_activity: NullableTimestamp })

export const TrafficStatsSchema = t.Object({
  overall: OverallTrafficSchema,
  by_model: t.Record(t.String(), ModelTrafficSchema),
})

export const ModelTrafficDetailSchema = t.Object({
  model: t.String(),
  ...trafficFields,
  last_activity: NullableTimestamp,
  idle_time: Seconds('seconds since the last activity'),
})

export const SleepStatusEntrySchema = t.Object({
  status: t.Union(
    [
      t.Literal('active'),
      t.Literal('sleeping'),
      t.Literal('waking'),
      t.Literal('loading'),
      t.Literal('unloaded'),
    ],
    {
      description:
        'active, sleeping, waking; for a gateway model served on demand also unloaded (catalogued, no instance: ' +
        'not asleep, a request loads it) and loading (its instance is starting)',
    },
  ),
  last_activity: t.Optional(NullableTimestamp),
  sleep_time: t.Optional(t.Union([Timestamp, t.Null()])),
  sleep_duration: t.Optional(Seconds('seconds asleep so far')),
  sleep_level: t.Optional(t.Union([t.Integer(), t.Null()])),
})

export const SleepStatusSchema = t.Object({ models: t.Record(t.String(), SleepStatusEntrySchema) })

export const SleepCandidatesSchema = t.Object({
  candidates: t.Array(
    t.Object({
      model: t.String(),
      idle_time: t.Number(),
      last_activity: NullableTimestamp,
      threshold: t.Integer(),
    }),
  ),
  auto_sleep_enabled: t.Boolean(),
  idle_threshold: t.Integer(),
})

export const ActionResultSchema = t.Object({
  status: t.Union([t.Literal('success'), t.Literal('error')]),
  model: t.String(),
  message: t.String(),
  timestamp: t.Optional(Timestamp),
  min_sleep_duration: t.Optional(t.Number({ description: 'min sleep duration refusal only' })),
  actual_sleep_duration: t.Optional(t.Number({ description: 'min sleep duration refusal only' })),
})

export const HealthSchema = t.Object({
  status: t.Literal('healthy'),
  timestamp: Timestamp,
  uptime: Seconds('seconds since the router started'),
  models_active: t.Integer(),
  models_sleeping: t.Integer({ description: 'sleeping or waking (an unloaded or loading model is neither)' }),
})

export const ModelHealthSchema = t.Object({
  model: t.String(),
  status: t.Union([t.Literal('healthy'), t.Literal('unhealthy')]),
  endpoint: EndpointSchema,
  response_time: t.Optional(Seconds('when healthy')),
  error: t.Optional(t.String({ description: 'when unhealthy' })),
})

export const ServerInfoSchema = t.Object({ version: t.String(), controller: t.String() })

/** RouterOverviewSchema: the router's models, traffic, sleep states and candidates, as its dashboard page draws them. */
export const RouterOverviewSchema = t.Object({
  models: t.Array(ModelEntrySchema),
  traffic: TrafficStatsSchema,
  sleep: t.Record(t.String(), SleepStatusEntrySchema),
  candidates: SleepCandidatesSchema,
})
