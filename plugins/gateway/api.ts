import type { Static } from 'elysia'
import type { Backend, SleepReason } from '../../src/directory/backend.ts'
import type { MemoryMetrics } from '../../src/engine/engine-logs.ts'
import type { GpuSnapshot } from '../../src/gpu/smi.ts'
import type { SpanBase } from '../../src/host/telemetry/spans.ts'
import type { WireAction, WireRequest } from '../../src/wire/route.ts'
import type { CatalogChange, CatalogEntry, CatalogEntryFields, CatalogSaved } from './catalog/schemas.ts'
import type { MemoryProfile } from './db/presets.ts'
import type { InstanceEvent, InstanceEventType } from './events.ts'
import type { Change, InstanceState, Operation, WaitOptions } from './lifecycle.ts'
import type { PresetDetail, PresetSummary, PresetSyncResult } from './presets/types.ts'
import type {
  GpuAvailableSchema,
  InstanceDetailSchema,
  InstanceEventsQuerySchema,
  InstanceSchema,
  InstanceStatusSchema,
  LoadBody,
  LoadResponseSchema,
  LogRecordSchema,
  LogsQuerySchema,
  MoveEventSchema,
  MovePhaseSchema,
  MoveRecordSchema,
  MultiGpuSchema,
  SleepCheckSchema,
  SleepLevelSchema,
  SleepQuerySchema,
  SleepResultSchema,
  SleepStatusSchema,
  UnloadResultSchema,
  WakeBodySchema,
  WakeResultSchema,
} from './schemas.ts'

/**
 * GatewayApi is what other plugins (router, benchmarks, later cluster) may call on the gateway, and
 * the records it returns. Field names are the HTTP API's instance fields (snake_case). Each
 * record is declared once, as the TypeBox schema in schemas.ts the routes validate and /docs shows;
 * the types here are derived from those schemas.
 */

/** InstanceStatus: `active` is the serving state; sleep and move results call it `running`. */
export type InstanceStatus = Static<typeof InstanceStatusSchema>

export type SleepLevel = Static<typeof SleepLevelSchema>

/** MemoryMetrics: an instance's memory_metrics record, per GPU, as parsed from the engine's log. */
export type { MemoryMetrics }

/** InstanceSummary: an instance as the list route shows it (no memory figures, no launch command). */
export type InstanceSummary = Static<typeof InstanceSchema>

/** InstanceRecord: the full instance resource (the detail route's `model`). */
export type InstanceRecord = Static<typeof InstanceDetailSchema>

/** LoadRequest: the load body; `force` skips the memory-profile pre-load check. */
export type LoadRequest = Static<typeof LoadBody>

export type LoadResponse = Static<typeof LoadResponseSchema>

export type SleepResult = Static<typeof SleepResultSchema>

/** WakeResult: `sleeping` while some parts (the woken `tags` only) are still asleep. */
export type WakeResult = Static<typeof WakeResultSchema>

export type SleepStatus = Static<typeof SleepStatusSchema>

/** SleepCheck: what a sleep freed per GPU against what its level should free (sleep_verified). */
export type SleepCheck = Static<typeof SleepCheckSchema>

/**
 * SleepOptions: how long the sleep may wait for in-flight requests (default
 * plugins.gateway.sleep.drain_timeout_ms), and a signal that cancels it while it still waits (409
 * SLEEP_CANCELLED; once the engine is asked to sleep the sleep runs to its end). `why: 'idle'`:
 * the router's auto-sleep, a rule of the residency manager (it refuses a pinned model and records
 * the sleep as one of its decisions).
 */
export interface SleepOptions {
  drainTimeoutMs?: number
  signal?: AbortSignal
  why?: SleepReason
}

/** LogRecord: an instance's recent log (recent engine lines, each prefixed with its stream in brackets). */
export type LogRecord = Static<typeof LogRecordSchema>

/** UnloadResult: what an unload answers: the engine is stopping. */
export type UnloadResult = Static<typeof UnloadResultSchema>

/** The inputs of the relayed routes, as those routes validate them. */
export type LogsQuery = Static<typeof LogsQuerySchema>
export type InstanceEventsQuery = Static<typeof InstanceEventsQuerySchema>
export type SleepQuery = Static<typeof SleepQuerySchema>
export type WakeRequest = Static<typeof WakeBodySchema>

/** GpuAvailable: the GPU availability view (GET /api/gpu/available). */
export type GpuAvailable = Static<typeof GpuAvailableSchema>

/** MultiGpuMemory: the multi-GPU memory usage view (GET /api/memory/usage/multi-gpu). */
export type MultiGpuMemory = Static<typeof MultiGpuSchema>

export type { InstanceEvent, InstanceEventType, InstanceState, Operation, WaitOptions }

/** MovePhase: a blue-green move's phases, in order; it ends in `completed` or `failed`. */
export type MovePhase = Static<typeof MovePhaseSchema>

/** MoveEvent: one move progress event (SSE `move_progress`, bus `gateway.move.progress`). */
export type MoveEvent = Static<typeof MoveEventSchema>

/** MoveRecord: a move, its latest event with its source, target and timings. */
export type MoveRecord = Static<typeof MoveRecordSchema>

/**
 * MoveFit: what a move's target GPUs must have room for: the instance's measured footprint per GPU
 * (null when never measured: the move is refused), or its engine's share of each GPU when larger.
 */
export interface MoveFit {
  instance_id: string
  footprint_gib: number | null
  gpu_memory_utilization: number
  sharedcache_enabled: boolean
}

/**
 * moveFit: the MoveFit of an instance record (what a move's target is checked with): its
 * largest measured per-GPU baseline, else its measured total, else null (never measured).
 */
export function moveFit(r: {
  id: string
  gpu_memory_utilization: number
  sharedcache_enabled: boolean
  memory_baseline_by_gpu?: Record<string, number> | null
  memory_metrics?: { total_gpu_memory_gib: number } | null
}): MoveFit {
  const baseline = r.memory_baseline_by_gpu
  const footprint =
    baseline && Object.keys(baseline).length
      ? Math.max(...Object.values(baseline))
      : (r.memory_metrics?.total_gpu_memory_gib ?? null)
  return {
    instance_id: r.id,
    footprint_gib: footprint,
    gpu_memory_utilization: r.gpu_memory_utilization,
    sharedcache_enabled: r.sharedcache_enabled,
  }
}

/**
 * TargetInstance: a move's target instance once loaded: its id, and the engine port it listens on
 * (what a cluster's routing table lists).
 */
export interface TargetInstance {
  instanceId: string
  port: number
}

/** MoveContext: what a move's target is made for (MoveRequest.target): the move, its source, its GPUs. */
export interface MoveContext {
  move_id: string
  source: InstanceRecord
  target_gpu_ids: number[]
  drain_timeout_ms: number
}

/**
 * MoveTarget: where a move's target runs, and how requests switch over to it. The move saga
 * (plugins/gateway/move/saga.ts) owns the phases, the cancel table, the events and the rollback, and
 * drives its source on this pod itself; a target is one of two kinds: GPUs on this pod (the
 * gateway's own, the default) or another pod of a cluster (plugins/cluster/move/pod-target.ts).
 * The saga calls each step at most once forward and again only to undo, so a step must be safe to
 * repeat after a lost answer. A step that waits takes the move's signal: a cancel aborts it with
 * the cancel as its reason.
 */
export interface MoveTarget {
  /** podId: the pod the target loads on (messages name it); null for GPUs on this pod. */
  readonly podId: string | null
  /** check (validating): the target GPUs exist and have room for `fit`. */
  check(fit: MoveFit): Promise<void>
  /** load (spawning): the target loads the source's settings out of routing, its move running. */
  load(req: LoadRequest, trace: SpanBase | null): Promise<TargetInstance>
  /** ready (spawning): resolves once the target is active, throws why not (failed, stopped, gone). */
  ready(onProgress: (percent: number, phase: string) => void, signal: AbortSignal): Promise<void>
  /**
   * switchTo (switching): the target takes requests wherever the model is routed, and the source
   * is no longer routed to from anywhere but this pod's own routing (the saga turns that off next).
   * `null` instead of a signal: a forced completion, which no cancel stops and no slow pod holds up.
   */
  switchTo(signal: AbortSignal | null): Promise<void>
  /** commit (completing): the target's move is over; it is an ordinary instance. */
  commit(): Promise<void>
  /** restoreSource (rollback): the source is routed to again wherever switchTo withdrew it. */
  restoreSource(): Promise<void>
  /**
   * release (rollback): the target leaves routing, drains its requests (up to `drainTimeoutMs`; 0 when
   * it never took any), unloads and is gone. Nothing when it was never loaded.
   */
  release(drainTimeoutMs: number): Promise<void>
}

/** MoveRequest: a move to start (GatewayMoves.start); the target GPUs are validated as `field` names them. */
export interface MoveRequest {
  instanceId: string
  targetGpuIds: number[]
  drainTimeoutMs: number
  /** target: the target for this move; default GPUs on this pod. */
  target?: (move: MoveContext) => MoveTarget
  /** admit: what must allow the move before its target is checked (a cluster's move lock); throws to refuse. */
  admit?: () => Promise<void>
  /** announce: where each event goes besides the move's stream (default the bus's `gateway.move.progress`). */
  announce?: (e: MoveEvent) => void
  /** field: the request's name for the target GPUs, in validation messages (default `target_gpu_ids`). */
  field?: string
}

/**
 * MoveSteps: a move target's steps on this pod's GPUs, by instance id. A move to GPUs of this pod
 * takes them; a cluster's target pod takes them for the pod that runs the move.
 */
export interface MoveSteps {
  /** check: the GPUs exist here and have room for `fit` (400 / 400 INSUFFICIENT_MEMORY / 503). */
  check(fit: MoveFit, gpuIds: number[]): Promise<void>
  /** load: the target loads out of routing, its move running (the load's span under `trace`). */
  load(req: LoadRequest, trace?: SpanBase | null): Promise<TargetInstance>
  /** ready: resolves once the instance is active, with its load progress; throws when it is not. */
  ready(id: string, onProgress: (percent: number, phase: string) => void, signal: AbortSignal): Promise<void>
  /**
   * serve: the target takes requests (409 INVALID_STATE unless active; 503 TARGET_UNHEALTHY when its
   * engine does not answer /health, which `health: false` skips); `signal` stops it before it does.
   */
  serve(id: string, opts?: { signal?: AbortSignal; health?: boolean }): Promise<void>
  /** commit: the instance's move is over (nothing when none runs; 404 when unknown). */
  commit(id: string): void
  /**
   * release: the instance out of routing, drained up to `drainTimeoutMs` (0: not at all; past it, it
   * goes on), its move ended, unloaded and gone (within `budgetMs`, default its engine's stop budget).
   * Nothing when it is unknown.
   */
  release(id: string, drainTimeoutMs: number, budgetMs?: number): Promise<void>
}

/** GatewayMoves: this pod's blue-green moves (plugins/gateway/move): one saga, any MoveTarget. */
export interface GatewayMoves {
  /** inProgress: a move runs on this pod (one at a time, whatever its target). */
  readonly inProgress: boolean
  /** start validates (400/404/409 as the move route answers) and runs the move in the background. */
  start(req: MoveRequest): Promise<MoveRecord>
  get(moveId: string): MoveRecord | undefined
  /** subscribe: the current phase, then each one; `onEnd` after completed or failed; null when unknown. */
  subscribe(moveId: string, fn: (e: MoveEvent) => void, onEnd: () => void): (() => void) | null
  /** cancel stops a move: 404 unknown, 409 too late (the move's cancel table). */
  cancel(moveId: string, force: boolean): void
  /** here: the target steps on this pod's GPUs. */
  readonly here: MoveSteps
}

/** GatewayProfiles: this pod's memory profiles, for the cluster's reconcile and bundles. */
export interface GatewayProfiles {
  list(): MemoryProfile[]
  /**
   * importAll keeps the newest profile of each key (model_path, max_tokens, gpu_name,
   * tensor_parallel_size; by created_at); an id already here is skipped. 400 for a bad created_at.
   */
  importAll(profiles: readonly MemoryProfile[]): { imported: number; skipped: number }
  /**
   * estimate: the memory one engine claims on each of its GPUs of a kind, by the pre-load check's
   * rule (the newest matching profile re-sized to the utilization and device), or, without a
   * profile, gpu_memory_utilization (default the gateway's) × the device.
   */
  estimate(q: NeedQuery): { gib: number; profile: { id: string; name: string } | null }
}

/** NeedQuery: a load's key for GatewayProfiles.estimate, on one GPU kind. */
export interface NeedQuery {
  model_path: string
  max_tokens?: number | undefined
  gpu_name: string
  gpu_total_gib: number
  tensor_parallel_size: number
  gpu_memory_utilization?: number | undefined
}

/** GatewayPresets: this pod's configuration presets, for the cluster's apply and sync. */
export interface GatewayPresets {
  list(): PresetSummary[]
  /** detail throws 404 (AppError) for an unknown id. */
  detail(id: string): PresetDetail
  /** sync: presets from the leader, upserted by id when newer; nothing deleted (PresetService.sync). */
  sync(presets: readonly PresetDetail[]): PresetSyncResult
}

/**
 * The profile and preset records, and the catalogue's: an entry, the fields a save takes, a save's
 * answer, a change on the bus (`gateway.catalog.changed`).
 */
export type {
  CatalogChange,
  CatalogEntry,
  CatalogEntryFields,
  CatalogSaved,
  MemoryProfile,
  PresetDetail,
  PresetSummary,
  PresetSyncResult,
}

/** InstanceRouting: an instance as routing sees it (GatewayPodApi.routingOf). */
export interface InstanceRouting {
  state: InstanceState
  operation: Operation | null
  routing: boolean
  inFlight: number
}

/** LoadOptions: how a new instance starts out (a move's target: not routed, its move running). */
export interface LoadOptions {
  routing?: boolean
  operation?: Operation
  /** trace: the span the load's own span goes under (a move's, a preset apply's); else its own trace. */
  trace?: SpanBase | null
}

/**
 * Lease is a routing reservation on an instance: call `release` when the response has fully ended.
 * It carries only what a proxied request needs (taken once per request, so no instance record).
 */
export interface Lease {
  instanceId: string
  /** The name the engine answers to (`--served-model-name`). */
  servedModelName: string
  /** baseUrl of the engine, e.g. http://127.0.0.1:8101 */
  baseUrl: string
  /** The engine's context length in tokens (null: not known), a request's worst case without max_tokens. */
  contextTokens: number | null
  release(): void
}

export interface GatewayApi {
  list(): InstanceRecord[]
  get(id: string): InstanceRecord | undefined
  load(req: LoadRequest): Promise<LoadResponse>
  unload(id: string): Promise<void>
  /**
   * sleep stops routing to the instance, waits for its in-flight requests (never cutting one: past
   * the drain deadline it is refused with 409 SLEEP_DRAIN_TIMEOUT and the instance serves again),
   * puts the engine to sleep and checks with nvidia-smi what it freed.
   */
  sleep(id: string, level: SleepLevel, opts?: SleepOptions): Promise<SleepResult>
  /** wake: `trace`, when given, is the span the wake's own span goes under (a request held for it). */
  wake(id: string, tags?: string[], trace?: SpanBase | null): Promise<WakeResult>
  /** engineBaseUrl is where an instance's engine listens. */
  engineBaseUrl(instance: InstanceRecord): string
  /**
   * backends: the instances a client's `model` names (an instance id, served name or model path),
   * as the model directory serves them (src/directory/backend.ts): readiness, a lease on each
   * instance's one in-flight count, its one wake.
   */
  backends(name: string): readonly Backend[]
  /** acquireByPort returns a lease on the managed instance listening on `port`, or null. */
  acquireByPort(port: number): Lease | null
  /** inFlight is the number of proxied requests currently open on an instance. */
  inFlight(id: string): number
  /** moveInProgress tells whether a blue-green move is running (one at a time, system-wide). */
  moveInProgress(): boolean
  /** gpuSnapshot: the GPUs and their processes as nvidia-smi last reported them (cached briefly). */
  gpuSnapshot(): Promise<GpuSnapshot>
  /**
   * gpuReading: the GPUs as a view shows them: the newest reading at once, however old (`takenAt`),
   * a fresh one taken in the background (GpuProbe.reading); never waits for nvidia-smi but at start.
   */
  gpuReading(): Promise<GpuSnapshot>
  /**
   * catalog: the models this host may serve on demand, by name: the YAML's entries (source `config`)
   * and those saved through the API (source `api`). Changes come as `gateway.catalog.changed`.
   */
  catalog(): CatalogEntry[]
  /** catalogEntry: the entry a client's `model` names (spelled exactly), or undefined. */
  catalogEntry(name: string): CatalogEntry | undefined
  /**
   * saveCatalogEntry creates or replaces an API entry, as PUT /api/catalog/{name} does (its checks and
   * AppErrors: 400 VALIDATION_ERROR, 400 CATALOG_ENTRY_TOO_LARGE, 409 CATALOG_ENTRY_FROM_CONFIG,
   * 409 CATALOG_NAME_TAKEN for a name that differs only in case from an entry).
   */
  saveCatalogEntry(
    name: string,
    fields: CatalogEntryFields,
  ): Promise<{ saved: CatalogSaved; created: boolean }>
  /** removeCatalogEntry removes an API entry, as DELETE /api/catalog/{name} does (404, 409 for the YAML's). */
  removeCatalogEntry(name: string): void
}

/**
 * PodRecords: what the gateway's lifecycle and view routes answer, from the very inputs those routes
 * validate (404 MODEL_NOT_FOUND, 409, 503 … as they answer). The gateway's own routes answer with
 * them, and a cluster relays them from a pod, so a peer's answer is that pod's own record.
 */
export interface PodRecords {
  /** POST /api/v1/models/load (202 there). */
  load(req: LoadRequest): Promise<LoadResponse>
  /** POST /api/v1/models/{id}/unload (202 there). */
  unload(id: string): Promise<UnloadResult>
  /** POST /api/models/instances/{id}/sleep. */
  sleep(id: string, query: SleepQuery): Promise<SleepResult>
  /** POST /api/models/instances/{id}/wake. */
  wake(id: string, body: WakeRequest | undefined): Promise<WakeResult>
  /** GET /api/v1/models/instances/{id}/logs. */
  logs(id: string, query: LogsQuery): LogRecord
  /** GET /api/v1/models/instances/{id}/events: its SSE response, which ends when the instance is gone or `signal` aborts. */
  events(id: string, query: InstanceEventsQuery, signal: AbortSignal): Response
  /** GET /api/gpu/available (503 GPU_PROBE_UNAVAILABLE without a probe). */
  gpuAvailable(): Promise<GpuAvailable>
  /** GET /api/memory/usage/multi-gpu (503 without a probe). */
  multiGpu(): Promise<MultiGpuMemory>
}

/**
 * GatewayPodApi: the gateway as a pod of a cluster sees it: GatewayApi plus the records its routes
 * answer (relayed from a pod by the cluster's remote routes), its moves, profiles and presets.
 */
export interface GatewayPodApi extends GatewayApi {
  /** records: what this pod's lifecycle and view routes answer. */
  readonly records: PodRecords
  /** inference: the inference proxy's extension point for a cluster (GatewayInferenceApi). */
  readonly inference: GatewayInferenceApi
  /** moves: this pod's blue-green moves: a cluster runs its own through them, with a target on another pod. */
  readonly moves: GatewayMoves
  /** profiles: the memory profiles kept on this pod. */
  readonly profiles: GatewayProfiles
  /** presets: the configuration presets kept on this pod. */
  readonly presets: GatewayPresets
  /**
   * load as GatewayApi.load, with how the instance starts out: a cross-pod move's target loads out of
   * routing with its move running, as the single-pod move's does.
   */
  load(req: LoadRequest, opts?: LoadOptions): Promise<LoadResponse>
  /** routingOf: an instance's state, its control operation, whether routing may pick it, its requests in flight (404). */
  routingOf(id: string): InstanceRouting
  /**
   * waitFor resolves with an instance's state once `ready` accepts it ('removed' once it is gone),
   * woken by its changes; rejects on the signal or deadline (WaitError).
   */
  waitFor(id: string, ready: (s: InstanceState) => boolean, opts?: WaitOptions): Promise<InstanceState>
}

/**
 * GatewayInferenceApi: what a cluster needs of the gateway's `/v1`: planning a request another pod
 * relayed here on this pod's instances only (a request crosses at most one hop), and listing the
 * models other pods serve in `GET /v1/models`. Where a request goes is the model directory's
 * (src/directory), to which the cluster adds the other pods as backends itself.
 */
export interface GatewayInferenceApi {
  /**
   * planLocal plans a model route (`path` as the gateway serves it, e.g. `/v1/chat/completions`) on
   * this pod's instances only, exactly as `/v1` does (wake on request included); a model this pod
   * does not hold is 400 `invalid_model` in the proxy shape.
   */
  planLocal(path: string, query: string, req: WireRequest): WireAction
  /** useRemoteModels: the models other pods serve, for `GET /v1/models` (one lister); returns its removal. */
  useRemoteModels(list: () => RemoteModel[]): () => void
}

/** RemoteModel: a model another pod serves, as `GET /v1/models` lists it after the local ones. */
/**
 * ListedState: a model's state in `GET /v1/models`: serving (`active`), asleep or loading (a request
 * waits for it or is told to retry, as `proxy.wake_on_request` says), or a catalogue entry not
 * loaded (`unloaded`: a request loads it).
 */
export type ListedState = 'active' | 'sleeping' | 'loading' | 'unloaded'

/** ListedModel: one entry of `GET /v1/models` (OpenAI's model object, with modelgate's fields). */
export interface ListedModel {
  id: string
  object: 'model'
  created: number
  owned_by: 'modelgate'
  root: string
  max_model_len: number | null
  state: ListedState
  /** The instance that serves it (null: none yet, a catalogue entry not loaded or not reported). */
  instance_id: string | null
  /** The pod that serves it, for a model of another pod of the cluster. */
  pod_id?: string
}

export interface RemoteModel {
  /** The served model name (what `model` names). */
  id: string
  /** When this pod first saw it in a routing table (Unix seconds). */
  created: number
  /** Its model path, and the instance and pod that serve it (the first pod that does; null instance: not reported yet). */
  root: string
  instance_id: string | null
  pod_id: string
  /** Its state on that pod. */
  state: ListedState
}

/** The preset and memory-profile record shapes and bundle format, for the cluster's fleet and placement routes. */
/**
 * The schemas of the records GatewayPodApi returns, for a dependent's routes to declare in /docs the
 * very records they relay (one declaration of each).
 */
export {
  CatalogEntrySchema,
  CatalogListSchema,
} from './catalog/schemas.ts'
export {
  EngineKindSchema,
  GpuAvailableSchema,
  InstanceDetailSchema,
  InstanceEventsQuerySchema,
  LoadBody,
  LoadResponseSchema,
  LogRecordSchema,
  LogsQuerySchema,
  MoveEventSchema,
  MoveRecordSchema,
  MultiGpuSchema,
  PROFILE_BUNDLE_FORMAT,
  PROFILE_BUNDLE_VERSION,
  PresetDetailSchema,
  ProfileBundleSchema,
  ProfileSchema,
  SleepQuerySchema,
  SleepResultSchema,
  UnloadResultSchema,
  WakeBodySchema,
  WakeResultSchema,
} from './schemas.ts'

/** Bus events the gateway emits (declaration merging onto the host's BusEvents). */
export interface InstanceStatusEvent {
  instance: InstanceRecord
  previousStatus: InstanceStatus | null
  currentStatus: InstanceStatus | 'removed'
  message: string
}

/** ProxyRequestEvent: one proxied inference request, emitted once when its response has fully ended (src/directory). */
export type { ProxyRequestEvent } from '../../src/directory/directory.ts'

/**
 * InstanceLifecycleEvent: every change of an instance's lifecycle (plugins/gateway/lifecycle.ts):
 * state changes (also sent as `gateway.instance.status`), operations beginning and ending, routing
 * turned on or off; `at` is performance.now() when it happened (for durations).
 */
export interface InstanceLifecycleEvent {
  instance_id: string
  served_model_name: string
  change: Change
  at: number
}

/**
 * InstanceSleepEvent: a sleep finished (`gateway.instance.sleep`), with its memory check; what the
 * metric of sleeps that freed too little counts (`verified === false`).
 */
export interface InstanceSleepEvent {
  instance_id: string
  served_model_name: string
  level: SleepLevel
  verified: boolean | null
  memory_check: SleepCheck
  fallback: 'warn' | 'unload' | null
}

declare module '../../src/host/bus.ts' {
  interface BusEvents {
    'gateway.instance.sleep': InstanceSleepEvent
    'gateway.instance.status': InstanceStatusEvent
    'gateway.instance.lifecycle': InstanceLifecycleEvent
  }
}
