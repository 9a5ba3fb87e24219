import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Backend } from '../../src/directory/backend.ts'
import type { EngineDriver } from '../../src/engine/driver.ts'
import { type EngineClient, engineOrigin } from '../../src/engine/engine-client.ts'
import type { EngineLogs } from '../../src/engine/engine-logs.ts'
import { engineDriver } from '../../src/engine/kinds.ts'
import type { EngineProcess } from '../../src/engine/supervisor.ts'
import type { PhaseSpans, TraceSpan } from '../../src/host/telemetry/spans.ts'
import type { InstanceRecord, InstanceStatus } from './api.ts'
import type { InstanceRow } from './db/schema.ts'
import { InstanceEvents } from './events.ts'
import { type Change, Lifecycle, type Operation } from './lifecycle.ts'

/**
 * ManagedInstance is the live state of one engine: its persisted row, its process, its log reader
 * and event stream, and its lifecycle (state, operation in progress, routing, in-flight requests:
 * lifecycle.ts), which is the only way any of those change. Its engine's driver (the row's
 * `engine_kind`) supplies the log reader and the control client.
 */
export class ManagedInstance {
  process: EngineProcess | null = null
  readonly events: InstanceEvents
  readonly driver: EngineDriver
  readonly logs: EngineLogs
  readonly client: EngineClient
  readonly lifecycle: Lifecycle
  /** lastProgress avoids re-emitting the same progress figure. */
  lastProgress = -1
  /** currentMemoryGib is the footprint per GPU last measured (ready, sleep, wake). */
  currentMemoryGib: Record<string, number> | null = null

  /**
   * holdsGibByGpu: what the instance holds on each of its GPUs now, the one figure every view shows
   * of it (the models list, the GPU and memory views, the catalogue's residency, /metrics): measured
   * in its current state (at readiness, after a sleep or a wake), else its readiness footprint, else
   * the engine log's total on each of its GPUs; null while none of them is known.
   */
  holdsGibByGpu(): Record<string, number> | null {
    if (this.currentMemoryGib) return this.currentMemoryGib
    const base = this.row.memory_baseline_by_gpu
    if (base && Object.keys(base).length) return base
    const total = this.row.memory_metrics?.total_gpu_memory_gib
    if (total === undefined) return null
    return Object.fromEntries(this.row.gpu_ids.map((g) => [String(g), Math.round(total * 100) / 100]))
  }
  /** backend: this instance as the model directory serves it (made once). */
  readonly backend: Backend
  /** startup: the load's span and its phases while the engine starts (ended once active or failed). */
  startup: { span: TraceSpan; phases: PhaseSpans } | null = null

  constructor(
    public row: InstanceRow,
    engineHost: string,
    maxLogLines: number,
    hints: { gpuMemoryUtilization?: number; deviceTotalGib?: number },
    report: (inst: ManagedInstance, change: Change) => void,
    opts: { routing?: boolean; operation?: Operation | null } = {},
    backend: (inst: ManagedInstance) => Backend,
  ) {
    this.lifecycle = new Lifecycle(row.id, row.status, opts, (c) => report(this, c))
    this.events = new InstanceEvents(row.id, maxLogLines)
    this.driver = engineDriver(row.engine_kind)
    this.logs = this.driver.logs(hints)
    this.client = this.driver.client(engineOrigin(engineHost, row.port))
    this.backend = backend(this)
  }

  get id(): string {
    return this.row.id
  }

  /** status: the lifecycle's state; a removed instance keeps the status it had (its row's). */
  get status(): InstanceStatus {
    return this.row.status
  }

  get inFlight(): number {
    return this.lifecycle.inFlight
  }

  get baseUrl(): string {
    return this.client.baseUrl
  }

  static logFiles(logDir: string) {
    return { stdout: join(logDir, 'stdout.log'), stderr: join(logDir, 'stderr.log') }
  }

  /**
   * writeLaunchRecord writes `launch.txt` (when and what was launched) into a new engine's log dir. The
   * row goes at unload while the logs stay, so this says which command wrote them; and it is the first
   * write to the log dir, so a full disk is found before an engine is started that could not log.
   */
  static writeLaunchRecord(row: InstanceRow): void {
    mkdirSync(row.log_dir, { recursive: true })
    writeFileSync(join(row.log_dir, 'launch.txt'), `${row.loaded_at} ${row.id}\n${row.launch_command}\n`)
  }

  record(): InstanceRecord {
    const r = this.row
    return {
      id: r.id,
      model_path: r.model_path,
      model_name: r.model_name,
      served_model_name: r.served_model_name,
      engine_kind: r.engine_kind,
      status: r.status,
      port: r.port,
      process_id: r.pid,
      max_tokens: r.max_tokens,
      gpu_memory_utilization: r.gpu_memory_utilization,
      gpu_ids: r.gpu_ids,
      tensor_parallel_size: r.tensor_parallel_size,
      sharedcache_enabled: r.sharedcache_enabled,
      enable_sleep_mode: r.enable_sleep_mode,
      sleep_level: r.sleep_level ?? null,
      slept_at: r.slept_at,
      loaded_at: r.loaded_at,
      ready_at: r.ready_at,
      extra_args: r.extra_args,
      error: r.error,
      evictable: r.evictable,
      memory_metrics: r.memory_metrics ?? null,
      memory_baseline_by_gpu: r.memory_baseline_by_gpu ?? null,
      memory_gib_by_gpu: this.holdsGibByGpu(),
      launch_command: r.launch_command,
    }
  }
}
