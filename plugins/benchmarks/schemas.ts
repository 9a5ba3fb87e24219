import { type Static, Type as T, type TSchema } from '@sinclair/typebox'

/**
 * The benchmark resources (run, status) as TypeBox schemas, so the
 * routes document exactly what the service returns. Response fields are snake_case;
 * the create body is camelCase.
 */
export const RunStatusSchema = T.Union([
  T.Literal('pending'),
  T.Literal('running'),
  T.Literal('completed'),
  T.Literal('cancelled'),
  T.Literal('failed'),
])
export type RunStatus = Static<typeof RunStatusSchema>
export const TERMINAL_STATUSES = ['completed', 'cancelled', 'failed'] as const satisfies readonly RunStatus[]

export const ScenarioStatusSchema = T.Union([
  T.Literal('pending'),
  T.Literal('running'),
  T.Literal('completed'),
  T.Literal('failed'),
  T.Literal('cancelled'),
])
export type ScenarioStatus = Static<typeof ScenarioStatusSchema>

export const ScenarioPhaseSchema = T.Union([
  T.Literal('queued'),
  T.Literal('preparing'),
  T.Literal('warmup'),
  T.Literal('measuring'),
  T.Literal('done'),
])
export type ScenarioPhase = Static<typeof ScenarioPhaseSchema>

export const RoutingModeSchema = T.Union([T.Literal('direct'), T.Literal('proxy')])
export type RoutingMode = Static<typeof RoutingModeSchema>

export const RunModeSchema = T.Union([T.Literal('isolated'), T.Literal('contention')])
export type RunMode = Static<typeof RunModeSchema>

/** Ms and PerRequest: figures of the successful requests only, null when none succeeded. */
const Ms = (description: string) =>
  T.Union([T.Number(), T.Null()], {
    description: `${description} (milliseconds); null when no request succeeded`,
  })
const PerRequest = (description: string) =>
  T.Union([T.Number(), T.Null()], { description: `${description}; null when no request succeeded` })
const Rate = (description: string) => T.Number({ description })

export const ScenarioMetricsSchema = T.Object(
  {
    ttft_avg: Ms('mean time to first token: first content chunk − send time'),
    ttft_p50: Ms('TTFT median'),
    ttft_p90: Ms('TTFT 90th percentile'),
    ttft_p95: Ms('TTFT 95th percentile'),
    ttft_p99: Ms('TTFT 99th percentile'),
    ttft_min: Ms('fastest TTFT'),
    ttft_max: Ms('slowest TTFT'),
    tps_avg: PerRequest('mean per-request output tokens per second: output tokens ÷ (E2E − TTFT)'),
    tps_p50: PerRequest('per-request TPS median'),
    tps_p90: PerRequest('per-request TPS 90th percentile'),
    tps_p95: PerRequest('per-request TPS 95th percentile'),
    tps_p99: PerRequest('per-request TPS 99th percentile'),
    e2e_avg: Ms('mean end-to-end latency: last content chunk − send time'),
    e2e_p50: Ms('E2E median'),
    e2e_p90: Ms('E2E 90th percentile'),
    e2e_p95: Ms('E2E 95th percentile'),
    e2e_p99: Ms('E2E 99th percentile'),
    e2e_min: Ms('fastest E2E'),
    e2e_max: Ms('slowest E2E'),
    tpot_avg: Ms('mean time per output token: (E2E − TTFT) ÷ (output tokens − 1)'),
    tpot_p50: Ms('TPOT median'),
    tpot_p90: Ms('TPOT 90th percentile'),
    tpot_p95: Ms('TPOT 95th percentile'),
    tpot_p99: Ms('TPOT 99th percentile'),
    itl_avg: Ms('mean inter-token latency: gap between consecutive content chunks'),
    itl_p50: Ms('ITL median'),
    itl_p90: Ms('ITL 90th percentile'),
    itl_p95: Ms('ITL 95th percentile'),
    itl_p99: Ms('ITL 99th percentile'),
    goodput_count: T.Integer({ description: 'successful requests that met every SLA set on the scenario' }),
    goodput_percent: T.Number({ description: 'goodput_count ÷ measured requests (failed included) × 100' }),
    goodput_requests_per_second: Rate('goodput_count ÷ duration_seconds (vLLM goodput)'),
    requests_per_second: Rate('successful requests ÷ duration_seconds'),
    tokens_per_second_total: Rate('output tokens of all successful requests ÷ duration_seconds'),
    total_tokens_per_second: Rate('(input + output tokens) ÷ duration_seconds'),
    input_tokens_total: T.Integer({ description: 'sum of usage.prompt_tokens' }),
    output_tokens_total: T.Integer({ description: 'sum of usage.completion_tokens' }),
    input_tokens_avg: T.Number(),
    output_tokens_avg: T.Number(),
    duration_seconds: T.Number({
      description: 'wall clock of the measured phase: first send → last response end',
    }),
    total_requests: T.Integer({ description: 'measured requests that finished (successful + failed)' }),
    successful_requests: T.Integer(),
    failed_requests: T.Integer(),
    cancelled_requests: T.Integer({ description: 'in flight when the run was cancelled; not counted above' }),
    usage_reported: T.Boolean({
      description: 'false when some stream lacked usage and content chunks were counted',
    }),
    sla_threshold_ms: T.Union([T.Number(), T.Null()]),
    sla_ttft_ms: T.Union([T.Number(), T.Null()]),
    sla_tpot_ms: T.Union([T.Number(), T.Null()]),
    errors: T.Array(T.Object({ message: T.String(), count: T.Integer() }), {
      description: 'the ten most frequent failure messages',
    }),
    failed_by_status: T.Optional(
      T.Record(T.String(), T.Integer(), {
        description:
          'failed requests by cause: the HTTP status (`"401"`), `"stream"` (a 2xx whose stream failed or ' +
          'carried no content) or `"no_response"` (no response head: refused, broken, timed out); ' +
          'absent from runs stored before it was recorded',
      }),
    ),
    first_errors: T.Optional(
      T.Array(T.String(), {
        description:
          'the first five distinct failure messages in the order they happened, e.g. ' +
          '`HTTP 401: invalid_api_key: Invalid API key`',
      }),
    ),
  },
  {
    description:
      'Scenario metrics; latency, TPOT, ITL and per-request TPS figures are null when no request succeeded',
  },
)
export type ScenarioMetrics = Static<typeof ScenarioMetricsSchema>

const Nullable = <S extends TSchema>(s: S, description?: string) =>
  T.Union([s, T.Null()], description ? { description } : {})

export const ScenarioSchema = T.Object({
  id: T.String(),
  instance_id: T.String(),
  routing_mode: RoutingModeSchema,
  model_path: T.String(),
  model_name: T.String(),
  input_tokens: T.Integer(),
  output_tokens: T.Integer(),
  concurrency: T.Integer(),
  warmup_requests: T.Integer(),
  total_requests: T.Integer(),
  sla_threshold_ms: Nullable(T.Number(), 'E2E SLA used for goodput'),
  sla_ttft_ms: Nullable(T.Number(), 'optional TTFT SLA used for goodput'),
  sla_tpot_ms: Nullable(T.Number(), 'optional TPOT SLA used for goodput'),
  request_rate: Nullable(T.Number(), 'open-loop Poisson arrival rate (requests/s); null means closed loop'),
  status: ScenarioStatusSchema,
  phase: ScenarioPhaseSchema,
  started_at: Nullable(T.String()),
  completed_at: Nullable(T.String()),
  warmup_completed: T.Integer(),
  completed_requests: T.Integer(),
  successful_requests: T.Integer(),
  failed_requests: T.Integer(),
  prompt_tokens: Nullable(T.Integer(), 'prompt length the engine tokenizer reported for the built prompt'),
  prompt_source: Nullable(T.Union([T.Literal('tokenize'), T.Literal('estimate')])),
  prompt_note: Nullable(T.String()),
  error: Nullable(T.String()),
  metrics: T.Optional(ScenarioMetricsSchema),
})
export type Scenario = Static<typeof ScenarioSchema>

const runFields = {
  id: T.String(),
  name: T.String(),
  status: RunStatusSchema,
  mode: RunModeSchema,
  sharedcache_enabled: T.Boolean({ description: 'whether any scenario instance had the shared KV cache on' }),
  created_at: T.String(),
  started_at: Nullable(T.String()),
  completed_at: Nullable(T.String()),
  total_requests: T.Integer({ description: 'measured requests over all scenarios' }),
  successful_requests: T.Integer(),
  failed_requests: T.Integer(),
  duration_seconds: Nullable(T.Number(), 'wall clock from start to end (so far, while running)'),
  error: Nullable(T.String(), 'why the run failed or was cancelled'),
}

export const RunSchema = T.Object({ ...runFields, scenarios: T.Array(ScenarioSchema) })
export type BenchmarkRun = Static<typeof RunSchema>

export const RunSummarySchema = T.Object({
  ...runFields,
  scenario_count: T.Integer(),
  model_names: T.Array(T.String()),
})
export type RunSummary = Static<typeof RunSummarySchema>

const PositiveInt = (description: string, maximum: number) => T.Integer({ minimum: 1, maximum, description })

export const CreateScenarioSchema = T.Object(
  {
    instanceId: T.String({ minLength: 1, description: 'an active model instance' }),
    routingMode: T.Optional(
      T.Union(RoutingModeSchema.anyOf, {
        default: 'direct',
        description: 'direct: the engine port; proxy: through the gateway /v1 (with the inference API key)',
      }),
    ),
    inputTokens: PositiveInt('prompt length in tokens, built exactly with the engine /tokenize', 1_048_576),
    outputTokens: PositiveInt('generated tokens per request (max_tokens with ignore_eos)', 1_048_576),
    concurrency: PositiveInt('requests in flight at most (closed loop unless requestRate is set)', 4096),
    warmupRequests: T.Integer({ minimum: 0, maximum: 10_000, description: 'sent first and discarded' }),
    totalRequests: PositiveInt('measured requests', 100_000),
    slaThresholdMs: T.Optional(T.Number({ exclusiveMinimum: 0, description: 'E2E SLA for goodput (ms)' })),
    slaTtftMs: T.Optional(T.Number({ exclusiveMinimum: 0, description: 'extra TTFT SLA for goodput (ms)' })),
    slaTpotMs: T.Optional(T.Number({ exclusiveMinimum: 0, description: 'extra TPOT SLA for goodput (ms)' })),
    requestRate: T.Optional(
      T.Number({
        exclusiveMinimum: 0,
        maximum: 100_000,
        description: 'open loop: Poisson arrivals at this many requests/s (capped by concurrency)',
      }),
    ),
  },
  { additionalProperties: false },
)
export type CreateScenario = Static<typeof CreateScenarioSchema>

export const CreateRunSchema = T.Object(
  {
    name: T.Optional(T.String({ maxLength: 200 })),
    mode: T.Union(RunModeSchema.anyOf, {
      description: 'isolated: scenarios one after another; contention: all at once',
    }),
    scenarios: T.Array(CreateScenarioSchema, { minItems: 1, maxItems: 32 }),
  },
  { additionalProperties: false },
)
export type CreateRun = Static<typeof CreateRunSchema>
