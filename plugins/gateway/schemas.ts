import type { TLiteral } from '@sinclair/typebox'
import { type Static, t } from 'elysia'
import { GPU_MEMORY_UTILIZATION_MIN } from '../../src/engine/driver.ts'
import type { MemoryMetrics } from '../../src/engine/engine-logs.ts'
import { ENGINE_KINDS, type EngineKind, WAKE_PHASES, WAKE_PHASES_DOC } from '../../src/engine/kinds.ts'

/**
 * The gateway's records as TypeBox schemas: the one declaration of each. Elysia validates requests
 * and responses with them and /docs shows them; api.ts derives the TypeScript types from them
 * (`Static<>`), so a field added here reaches the routes, the docs and every caller at once.
 */
export const InstanceStatusSchema = t.Union(
  [
    t.Literal('starting'),
    t.Literal('active'),
    t.Literal('sleeping'),
    t.Literal('stopping'),
    t.Literal('failed'),
  ],
  { description: '`active` is the serving state (called `running` in the sleep and move sections)' },
)

/**
 * literals: a union of string literals from a list built at run time (the engine kinds, their wake
 * phases), typed as a non-empty tuple so its static type is the union of the values.
 */
function literals<T extends string>(values: readonly T[], description: string) {
  const schemas = values.map((v) => t.Literal(v)) as [TLiteral<T>, ...TLiteral<T>[]]
  return t.Union(schemas, { description })
}

/** EngineKindSchema: the engines this modelgate can run (src/engine/kinds.ts). */
export const EngineKindSchema = literals<EngineKind>(ENGINE_KINDS, 'the inference engine an instance runs')

/** Sleep levels: 1 offloads the weights to CPU and discards the KV cache, 2 discards both. */
export const SleepLevelSchema = t.Union([t.Literal(1), t.Literal(2)])

export const MemoryMetricsSchema = t.Object({
  total_gpu_memory_gib: t.Number(),
  weights_memory_gib: t.Number(),
  cuda_graph_memory_gib: t.Number(),
  overhead_memory_gib: t.Number(),
  kv_cache_available_gib: t.Number(),
  kv_cache_per_request_mib: t.Number(),
  max_model_len: t.Number(),
})

/**
 * The engine library parses memory_metrics (src/engine/engine-logs.ts, which cannot import a plugin);
 * these two lines fail to compile when its interface and the schema above stop describing the same
 * record.
 */
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false
const memoryMetricsInStep: Same<Static<typeof MemoryMetricsSchema>, MemoryMetrics> = true
void memoryMetricsInStep

export const InstanceSchema = t.Object({
  id: t.String(),
  model_path: t.String(),
  model_name: t.String(),
  served_model_name: t.String(),
  engine_kind: EngineKindSchema,
  status: InstanceStatusSchema,
  port: t.Number(),
  process_id: t.Nullable(t.Number()),
  max_tokens: t.Nullable(t.Number({ description: 'context length (null until the engine reports it)' })),
  gpu_memory_utilization: t.Number(),
  gpu_ids: t.Array(t.Number()),
  tensor_parallel_size: t.Number(),
  sharedcache_enabled: t.Boolean(),
  enable_sleep_mode: t.Boolean(),
  sleep_level: t.Nullable(SleepLevelSchema),
  slept_at: t.Nullable(t.String()),
  loaded_at: t.String(),
  ready_at: t.Nullable(t.String()),
  extra_args: t.Array(t.String()),
  error: t.Nullable(t.String({ description: "the engine's own failure line when failed" })),
  memory_gib_by_gpu: t.Nullable(
    t.Record(t.String(), t.Number(), {
      description:
        'GiB the instance holds on each GPU index now, measured in its current state (at readiness, after a ' +
        'sleep or wake): the one figure every view shows of it (null: not known yet)',
    }),
  ),
  evictable: t.Boolean({
    description:
      'the load said `evictable: true`: the residency manager may sleep or unload it to make room for another ' +
      'model. false for a model loaded by hand without it, which stays until it is unloaded',
  }),
})

export const InstanceDetailSchema = t.Composite([
  InstanceSchema,
  t.Object({
    memory_metrics: t.Nullable(MemoryMetricsSchema),
    memory_baseline_by_gpu: t.Nullable(
      t.Record(t.String(), t.Number(), { description: 'GiB per GPU index' }),
    ),
    launch_command: t.String(),
  }),
])

export const LoadBody = t.Object(
  {
    model_path: t.String({ minLength: 1, description: 'model hub path or local path' }),
    max_tokens: t.Optional(
      t.Integer({ minimum: 1, description: "context length; default: the model's maximum" }),
    ),
    gpu_ids: t.Optional(t.Array(t.Integer({ minimum: 0 }), { minItems: 1 })),
    tensor_parallel_size: t.Optional(t.Integer({ minimum: 1, maximum: 64 })),
    extra_args: t.Optional(t.Array(t.String(), { description: 'appended to the engine command line' })),
    enable_sleep_mode: t.Optional(t.Boolean()),
    served_model_name: t.Optional(t.String({ minLength: 1, description: 'default: model_path' })),
    gpu_memory_utilization: t.Optional(
      t.Number({
        minimum: GPU_MEMORY_UTILIZATION_MIN,
        maximum: 1,
        description: 'default: plugins.gateway.engine.gpu_memory_utilization',
      }),
    ),
    force: t.Optional(
      t.Boolean({ description: 'load even when the memory-profile pre-load check says danger' }),
    ),
    evictable: t.Optional(
      t.Boolean({
        default: false,
        description:
          'the residency manager may sleep or unload this instance to make room for another model; default false: ' +
          'a model loaded by hand stays until it is unloaded',
      }),
    ),
    engine_kind: t.Optional(
      literals<EngineKind>(
        ENGINE_KINDS,
        'the engine to run (a host may run several); default: plugins.gateway.engine.kind',
      ),
    ),
  },
  { additionalProperties: false },
)

export const LoadResponseSchema = t.Object({
  status: t.Literal('starting'),
  model: t.String(),
  port: t.Number(),
  loaded_at: t.String(),
  instance_id: t.String(),
})

/** WakePhaseSchema: one step of a wake, as the instance's engine names it (its driver's wakePhases). */
export const WakePhaseSchema = literals(WAKE_PHASES, WAKE_PHASES_DOC)

/** SleepCheckSchema: what a sleep freed per GPU, measured with nvidia-smi against the figure awake. */
export const SleepCheckSchema = t.Object(
  {
    verified: t.Nullable(
      t.Boolean({
        description:
          'true: every GPU freed at least its required share; false: one did not; null: not measurable ' +
          '(no GPU probe, or nvidia-smi shows no process of the engine: another PID namespace)',
      }),
    ),
    releases: t.Union([t.Literal('weights_and_kv_cache'), t.Literal('weights')], {
      description:
        'what a sleep of this engine can release: its weights and KV cache, or its weights alone for a ' +
        "shared-cache engine (kvcached maps its KV pages outside vLLM's sleep allocator)",
    }),
    expected_share: t.Number({
      description:
        'share of what the engine can release (`releases`) a sleep of this level frees: 0.9 (level 1), ' +
        '0.95 (level 2)',
    }),
    tolerance_share: t.Number({ description: 'allowed shortfall, a share of what it can release (0.05)' }),
    tolerance_gib: t.Number({ description: 'allowed shortfall in GiB per GPU besides the share (0.25)' }),
    gpus: t.Record(
      t.String(),
      t.Object({
        awake_gib: t.Number({ description: "the engine's process group right before the sleep" }),
        asleep_gib: t.Number({ description: 'the same right after it' }),
        freed_gib: t.Number(),
        releasable_gib: t.Number({
          description:
            'weights + KV cache (the weights alone for a shared-cache engine) from the engine log, capped at ' +
            'awake_gib; awake_gib without them',
        }),
        required_gib: t.Number({ description: 'releasable × (expected − tolerance share) − tolerance_gib' }),
      }),
      { description: 'by GPU index' },
    ),
    reason: t.Nullable(t.String({ description: 'why the sleep is not verified, or could not be measured' })),
    checked_at: t.String(),
  },
  { description: "the memory check of a sleep (see the gateway's README, Sleep and wake)" },
)

export const SleepResultSchema = t.Object({
  status: t.Union([t.Literal('sleeping'), t.Literal('stopping')], {
    description:
      '`stopping` when the sleep freed too little and plugins.gateway.sleep.verify_fallback is `unload`',
  }),
  instance_id: t.String(),
  model_path: t.String(),
  sleep_level: SleepLevelSchema,
  slept_at: t.String(),
  drained_requests: t.Number({
    description: 'requests that were in flight when the sleep was asked and finished before it',
  }),
  drain_ms: t.Number({ description: 'time spent waiting for them' }),
  mode: t.Nullable(
    t.Union([t.Literal('wait'), t.Literal('keep')], {
      description:
        "the engine's /sleep mode sent: `keep` where the engine recomputes kept requests after the wake, else `wait` (null: the engine refused the parameter)",
    }),
  ),
  sleep_verified: t.Nullable(t.Boolean({ description: 'memory_check.verified' })),
  memory_check: SleepCheckSchema,
  fallback: t.Nullable(
    t.Union([t.Literal('warn'), t.Literal('unload')], {
      description: 'what was done because sleep_verified is false (null otherwise)',
    }),
  ),
})

export const WakeResultSchema = t.Object({
  status: t.Union([t.Literal('running'), t.Literal('sleeping')], {
    description: '`running` when fully awake; `sleeping` while some parts (tags) are still asleep',
  }),
  instance_id: t.String(),
  model_path: t.String(),
  woke_at: t.String(),
  tags: t.Optional(t.Array(t.String())),
  sleep_level: t.Nullable(SleepLevelSchema),
  phases: t.Array(WakePhaseSchema, { description: 'the phases this wake ran, in order' }),
})

/**
 * The inputs and answers of the lifecycle routes a cluster relays from a pod (PodRecords), declared
 * once for the gateway's routes and the cluster's.
 */

/** UnloadResultSchema: what an unload answers (202): the engine is stopping. */
export const UnloadResultSchema = t.Object({
  status: t.Literal('stopping'),
  instance_id: t.String(),
  message: t.String(),
})

export const LogRecordSchema = t.Object({
  instance_id: t.String(),
  logs: t.String({ description: 'lines prefixed [stdout] / [stderr], joined by newline' }),
  line_count: t.Number(),
})

export const LogsQuerySchema = t.Object({
  lines: t.Optional(
    t.Numeric({ minimum: 1, maximum: 500, error: 'query.lines: must be an integer from 1 to 500' }),
  ),
})

export const InstanceEventsQuerySchema = t.Object({
  types: t.Optional(
    t.String({ description: 'comma list of log,status,memory,progress,error (default all)' }),
  ),
  replay_logs: t.Optional(t.String({ description: "'true' (default) replays buffered logs on connect" })),
  token: t.Optional(t.String({ description: 'admin JWT for browsers (EventSource cannot set headers)' })),
})

export const SleepQuerySchema = t.Object({
  level: t.Optional(
    t.Numeric({ minimum: 1, maximum: 2, multipleOf: 1, error: 'query.level: must be 1 or 2' }),
  ),
  drain_timeout_ms: t.Optional(
    t.Numeric({
      minimum: 0,
      maximum: 86_400_000,
      multipleOf: 1,
      error: 'query.drain_timeout_ms: must be an integer from 0 to 86400000',
      description: 'default plugins.gateway.sleep.drain_timeout_ms; 0: refuse at once when busy',
    }),
  ),
})

const WakeTag = t.Union([t.Literal('weights'), t.Literal('kv_cache')])

/** WakeBodySchema: {tags}: one tag or a list; none wakes everything. */
export const WakeBodySchema = t.Object(
  { tags: t.Optional(t.Union([WakeTag, t.Array(WakeTag)])) },
  { additionalProperties: false },
)

/** WakeProgressSchema: the wakes since the last sleep: what finished, and where the last one failed. */
export const WakeProgressSchema = t.Object({
  phases_done: t.Array(WakePhaseSchema),
  failed_phase: t.Nullable(
    t.Union([WakePhaseSchema, t.Literal('is_sleeping')], {
      description:
        'the phase the last wake failed at; the instance stays sleeping (not routed) until a wake finishes',
    }),
  ),
  error: t.Nullable(t.String()),
  at: t.String(),
})

export const SleepStatusSchema = t.Object({
  instance_id: t.String(),
  status: InstanceStatusSchema,
  is_sleeping: t.Boolean(),
  sleep_level: t.Nullable(SleepLevelSchema),
  slept_at: t.Nullable(t.String()),
  enable_sleep_mode: t.Boolean(),
  engine_is_sleeping: t.Nullable(
    t.Boolean({ description: "the engine's own /is_sleeping (null: not asked)" }),
  ),
  operation: t.Nullable(
    t.Union([t.Literal('sleep'), t.Literal('wake'), t.Literal('move')], {
      description: 'the operation under way (`sleep` while it drains: no new requests are routed)',
    }),
  ),
  in_flight: t.Number({ description: 'requests open on the instance' }),
  sleep_verified: t.Nullable(t.Boolean({ description: 'of the last sleep (null: unknown or none)' })),
  memory_check: t.Nullable(SleepCheckSchema),
  wake: t.Nullable(WakeProgressSchema),
})

const KvCache = t.Object({
  total_gb: t.Number(),
  prealloc_gb: t.Number(),
  used_gb: t.Number(),
  free_gb: t.Number(),
})
const ModelMemory = t.Object({
  model_path: t.String(),
  instance_id: t.String(),
  display_name: t.String(),
  gpu_memory_gb: t.Number({
    description:
      'GiB the instance holds now (on this GPU in a per-GPU row; on all its GPUs in /api/memory/usage)',
  }),
  weights_gb: t.Number({ description: 'of that, its weights and CUDA graphs' }),
  color: t.String(),
})

export const GpuAvailableSchema = t.Object({
  gpus: t.Array(
    t.Object({
      index: t.Number(),
      name: t.String(),
      memory_total_mb: t.Nullable(t.Number()),
      memory_used_mb: t.Nullable(t.Number()),
      memory_free_mb: t.Nullable(t.Number()),
      utilization_percent: t.Nullable(t.Number()),
      models_loaded: t.Number(),
      recommended: t.Boolean(),
    }),
  ),
  recommendation: t.Nullable(
    t.Object({ gpu_id: t.Number(), free_memory_gb: t.Number(), reason: t.String() }),
  ),
})

export const MemoryUsageSchema = t.Object({
  kvcache: t.Optional(KvCache),
  gpu: t.Object({
    total_gb: t.Number(),
    used_gb: t.Number(),
    free_gb: t.Number(),
    utilization_percent: t.Number(),
  }),
  models: t.Array(ModelMemory),
})

export const MultiGpuSchema = t.Object({
  gpus: t.Array(
    t.Object({
      gpu_index: t.Number(),
      name: t.String(),
      total_gb: t.Nullable(t.Number()),
      used_gb: t.Nullable(t.Number()),
      free_gb: t.Nullable(t.Number()),
      utilization_percent: t.Nullable(t.Number()),
      models: t.Array(ModelMemory),
      kvcache: t.Optional(KvCache),
    }),
  ),
  kvcache: KvCache,
  total_system_free_gb: t.Number(),
})

/** The phases of a blue-green move, in order; it ends in `completed` or `failed` (rolled back). */
export const MovePhaseSchema = t.Union([
  t.Literal('validating'),
  t.Literal('spawning'),
  t.Literal('switching'),
  t.Literal('draining'),
  t.Literal('completing'),
  t.Literal('completed'),
  t.Literal('failed'),
])

const moveEventFields = {
  move_id: t.String(),
  phase: MovePhaseSchema,
  message: t.String(),
  progress: t.Nullable(t.Number()),
  error: t.Nullable(t.String()),
}

/** MoveEventSchema: one `move_progress` event (also the bus event `gateway.move.progress`). */
export const MoveEventSchema = t.Object(moveEventFields)

/** MoveRecordSchema: a move as the start route answers it, its latest event with what it moves. */
const { move_id, ...moveProgress } = moveEventFields
export const MoveRecordSchema = t.Object({
  move_id,
  instance_id: t.String(),
  target_instance_id: t.Nullable(t.String()),
  source_gpu_ids: t.Array(t.Number()),
  target_gpu_ids: t.Array(t.Number()),
  drain_timeout_ms: t.Number(),
  ...moveProgress,
  started_at: t.String(),
  finished_at: t.Nullable(t.String()),
})

/** ProfileSourceSchema: `auto` recorded at readiness, `instance` saved on request from a running one, `manual` typed in. */
export const ProfileSourceSchema = t.Union([t.Literal('auto'), t.Literal('manual'), t.Literal('instance')])

/** PresetSourceTypeSchema: `local` for paths starting with / or ., else `huggingface` (a model-hub path). */
export const PresetSourceTypeSchema = t.Union([t.Literal('huggingface'), t.Literal('local')], {
  description: '`local` for paths starting with / or ., else `huggingface` (a model-hub path)',
})

/** Memory profiles: one record, and the export/import bundle (also the cluster's reconcile format). */
export const PROFILE_BUNDLE_FORMAT = 'modelgate.memory-profiles' as const
export const PROFILE_BUNDLE_VERSION = 1

const Gib = (description?: string) => t.Number({ minimum: 0, ...(description ? { description } : {}) })

export const ProfileSchema = t.Object({
  id: t.String({ minLength: 1 }),
  profile_name: t.String(),
  model_path: t.String({ minLength: 1 }),
  max_tokens: t.Integer({ minimum: 1 }),
  total_gpu_memory_gib: Gib('footprint per GPU (one TP rank)'),
  weights_memory_gib: Gib(),
  cuda_graphs_gib: Gib(),
  overhead_memory_gib: Gib('activation peak and non-torch memory'),
  kv_cache_available_gib: Gib(),
  gpu_name: t.String({ minLength: 1 }),
  gpu_total_memory_gib: Gib(),
  tensor_parallel_size: t.Integer({ minimum: 1 }),
  gpu_memory_utilization: t.Nullable(
    t.Number({ description: 'utilization the engine ran at; null for kvcached engines and unknown' }),
  ),
  source: ProfileSourceSchema,
  comments: t.Nullable(t.String()),
  created_at: t.String({ description: 'when the figures were measured or entered (ISO 8601)' }),
})

export const ProfileBundleSchema = t.Object({
  format: t.Literal(PROFILE_BUNDLE_FORMAT),
  version: t.Integer({ minimum: 1, description: `this server reads version ${PROFILE_BUNDLE_VERSION}` }),
  exported_at: t.String(),
  source: t.Optional(t.Object({ modelgate_version: t.String() })),
  profiles: t.Array(ProfileSchema),
})

/** Configuration presets: the summary the list shows and the detail with its entries. */
export const PresetSummarySchema = t.Object({
  id: t.String(),
  name: t.String(),
  description: t.Nullable(t.String()),
  modelCount: t.Number(),
  createdAt: t.String(),
  updatedAt: t.String(),
})

const Entry = t.Object({
  id: t.String(),
  modelPath: t.String(),
  servedModelName: t.String(),
  maxTokens: t.Nullable(t.Number({ description: 'context length the model ran with' })),
  sourceType: PresetSourceTypeSchema,
  gpuIds: t.Array(t.Number()),
  tensorParallelSize: t.Number(),
  extraArgs: t.Array(t.String()),
  loadOrder: t.Number({ description: 'from 0, the order the models were loaded in' }),
  enableSleepMode: t.Boolean(),
  gpuMemoryUtilization: t.Nullable(t.Number()),
  // Optional: a leader older than it syncs presets without it (null or absent: the pod's engine.kind).
  engineKind: t.Optional(
    t.Nullable(EngineKindSchema, {
      description:
        'the engine the model ran when saved, which loading the configuration runs again; null: saved before ' +
        'configurations kept it, loaded with plugins.gateway.engine.kind',
    }),
  ),
})

export const PresetDetailSchema = t.Composite([PresetSummarySchema, t.Object({ entries: t.Array(Entry) })])
