import type { MemoryMetrics } from '../../src/engine/vllm-log.ts'

/**
 * GatewayApi is what other plugins (router, benchmarks, later cluster) may call on the gateway, and
 * the records it returns. Field names follow the spec's Model instance resource (snake_case).
 */

/** InstanceStatus: `active` is the serving state; the spec's sleep and move sections call it `running`. */
export type InstanceStatus = 'starting' | 'active' | 'sleeping' | 'stopping' | 'failed'

/** MemoryMetrics: the spec's memory_metrics record, per GPU, as parsed from the engine's log. */
export type { MemoryMetrics }

export interface InstanceRecord {
  id: string
  model_path: string
  model_name: string
  served_model_name: string
  status: InstanceStatus
  port: number
  process_id: number | null
  max_tokens: number | null
  gpu_memory_utilization: number
  gpu_ids: number[]
  tensor_parallel_size: number
  sharedcache_enabled: boolean
  enable_sleep_mode: boolean
  sleep_level: 1 | 2 | null
  slept_at: string | null
  loaded_at: string
  ready_at: string | null
  extra_args: string[]
  /** error: the engine's own failure line when status is failed. */
  error: string | null
  memory_metrics: MemoryMetrics | null
  memory_baseline_by_gpu: Record<string, number> | null
  launch_command: string
}

export interface LoadRequest {
  model_path: string
  max_tokens?: number
  gpu_ids?: number[]
  tensor_parallel_size?: number
  extra_args?: string[]
  enable_sleep_mode?: boolean
  served_model_name?: string
  gpu_memory_utilization?: number
  /** force skips the memory-profile pre-load check (a danger verdict otherwise refuses the load). */
  force?: boolean
}

export interface LoadResponse {
  status: 'starting'
  model: string
  port: number
  loaded_at: string
  instance_id: string
}

export interface SleepResult {
  status: 'sleeping'
  instance_id: string
  model_path: string
  sleep_level: 1 | 2
  slept_at: string
}

export interface WakeResult {
  status: 'running'
  instance_id: string
  model_path: string
  woke_at: string
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
  release(): void
}

export interface GatewayApi {
  list(): InstanceRecord[]
  get(id: string): InstanceRecord | undefined
  load(req: LoadRequest): Promise<LoadResponse>
  unload(id: string): Promise<void>
  sleep(id: string, level: 1 | 2): Promise<SleepResult>
  wake(id: string, tags?: string[]): Promise<WakeResult>
  /** engineBaseUrl is where an instance's engine listens. */
  engineBaseUrl(instance: InstanceRecord): string
  /**
   * acquire picks a routable instance for a model field (instance id, served name or model path),
   * least outstanding requests first, and counts the request as in flight until released. Throws
   * an AppError in the proxy shape: 400 invalid_model, 503 model_not_ready / model_sleeping.
   */
  acquire(model: string): Lease
  /** acquireByPort returns a lease on the managed instance listening on `port`, or null. */
  acquireByPort(port: number): Lease | null
  /** inFlight is the number of proxied requests currently open on an instance. */
  inFlight(id: string): number
  /** moveInProgress tells whether a blue-green move is running (one at a time, system-wide). */
  moveInProgress(): boolean
}

/** Bus events the gateway emits (declaration merging onto the host's BusEvents). */
export interface InstanceStatusEvent {
  instance: InstanceRecord
  previousStatus: InstanceStatus | null
  currentStatus: InstanceStatus | 'removed'
  message: string
}

/** ProxyRequestEvent: one proxied inference request, emitted when its response has fully ended. */
export interface ProxyRequestEvent {
  model: string
  instance_id: string | null
  status: number
  duration_ms: number
  ttft_ms: number | null
  streamed: boolean
  path: string
}

declare module '../../src/host/bus.ts' {
  interface BusEvents {
    'gateway.instance.status': InstanceStatusEvent
    'proxy.request': ProxyRequestEvent
  }
}
