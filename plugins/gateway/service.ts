import { randomBytes } from 'node:crypto'
import { join } from 'node:path'
import { PortAllocator, portIsFree } from '../../src/engine/ports.ts'
import { groupPids, sameProcess, stopGroup } from '../../src/engine/process.ts'
import { EngineProcess, type LogStream } from '../../src/engine/supervisor.ts'
import { EngineCallError, waitHealthy } from '../../src/engine/vllm-client.ts'
import {
  buildEngineEnv,
  buildVllmArgs,
  findFlagValue,
  hasFlag,
  quoteCommand,
  removeFlag,
} from '../../src/engine/vllm-command.ts'
import { shortModelName } from '../../src/gpu/colors.ts'
import {
  readKvcachedSegment,
  removeKvcachedSegment,
  sharedCacheSegmentName,
  writeKvcachedSegment,
} from '../../src/gpu/kvcached.ts'
import { GpuProbe, type GpuSnapshot } from '../../src/gpu/smi.ts'
import type { EventBus } from '../../src/host/bus.ts'
import type { Logger } from '../../src/host/logger.ts'
import { AppError, badRequest, conflict, modelNotFound, proxyError } from '../../src/http/errors.ts'
import type {
  GatewayApi,
  InstanceRecord,
  InstanceStatus,
  Lease,
  LoadRequest,
  LoadResponse,
  SleepResult,
  WakeResult,
} from './api.ts'
import { expandSelf, type GatewayConfig } from './config.ts'
import { ManagedInstance } from './instance.ts'
import { MoveManager } from './move.ts'
import { placeOnGpus, usedMibByGpuForPids } from './placement.ts'
import type { InstanceRepo } from './repo.ts'
import type { InstanceRow } from './schema.ts'

/**
 * GatewayService owns every engine instance: it validates and places loads, spawns and supervises
 * engine process groups, follows their logs to readiness, sleeps and wakes them, hands out
 * routing leases to the proxy, and re-adopts or stops engines found after a restart.
 */
/** PreloadCheck runs after placement and before spawning; it throws an AppError to refuse a load. */
export type PreloadCheck = (req: LoadRequest, gpuIds: number[]) => Promise<void>

export interface GatewayDeps {
  config: GatewayConfig
  repo: InstanceRepo
  bus: EventBus
  log: Logger
  dataDir: string
  selfCommand: readonly string[]
}

/** Flags the gateway sets from the load body; giving them in extra_args would contradict it. */
const MANAGED_FLAGS = [
  '--host',
  '--tensor-parallel-size',
  '-tp',
  '--max-model-len',
  '--served-model-name',
  '--gpu-memory-utilization',
  '--enable-sleep-mode',
]

const RETRY_AFTER_STARTING = '10'
const RETRY_AFTER_SLEEPING = '5'

function slug(s: string): string {
  return (
    s
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, '-')
      .replace(/^-|-$/g, '')
      .slice(0, 40) || 'model'
  )
}

export class GatewayService implements GatewayApi {
  readonly instances = new Map<string, ManagedInstance>()
  readonly probe: GpuProbe
  private readonly ports: PortAllocator
  private stopping = false
  /** preloadCheck is set by the memory-profile feature (a seam, so placement stays independent of it). */
  preloadCheck: PreloadCheck | null = null
  /** moves runs blue-green moves of this service's instances. */
  readonly moves: MoveManager
  private readonly background = new Set<Promise<unknown>>()

  constructor(private readonly deps: GatewayDeps) {
    const { config } = deps
    const smi = config.gpu.smi_command ? expandSelf(config.gpu.smi_command, deps.selfCommand) : null
    this.probe = new GpuProbe(smi, { timeoutMs: config.gpu.timeout_ms, cacheMs: config.gpu.cache_ms })
    this.ports = new PortAllocator(
      config.engine.host,
      config.engine.port_range.start,
      config.engine.port_range.end,
    )
    this.moves = new MoveManager(this, deps.bus, deps.log.child('move'))
  }

  // ---- queries ----

  list(): InstanceRecord[] {
    return [...this.instances.values()].map((i) => i.record())
  }

  get(id: string): InstanceRecord | undefined {
    return this.instances.get(id)?.record()
  }

  require(id: string): ManagedInstance {
    const inst = this.instances.get(id)
    if (!inst) throw modelNotFound(id)
    return inst
  }

  engineBaseUrl(instance: InstanceRecord): string {
    return this.instances.get(instance.id)?.baseUrl ?? `http://127.0.0.1:${instance.port}`
  }

  moveInProgress(): boolean {
    return this.moves.inProgress
  }

  inFlight(id: string): number {
    return this.instances.get(id)?.inFlight ?? 0
  }

  async gpuSnapshot(): Promise<GpuSnapshot> {
    return this.probe.snapshot()
  }

  // ---- routing leases (used by the proxy) ----

  private lease(inst: ManagedInstance): Lease {
    inst.inFlight++
    return new InstanceLease(inst)
  }

  acquire(model: string): Lease {
    let best: ManagedInstance | null = null
    let sleeping = false
    let starting = false
    let matched = false
    for (const inst of this.instances.values()) {
      const r = inst.row
      if (r.id !== model && r.served_model_name !== model && r.model_path !== model) continue
      matched = true
      // An instance going to sleep takes no new requests: they would reach an engine mid-sleep.
      if (r.status === 'active' && inst.routable && inst.busy !== 'sleep') {
        if (!best || inst.inFlight < best.inFlight) best = inst
      } else if (r.status === 'sleeping' || inst.busy === 'sleep') sleeping = true
      else if (r.status === 'starting') starting = true
    }
    if (best) return this.lease(best)
    if (!matched)
      throw proxyError(
        400,
        'invalid_request_error',
        'invalid_model',
        `The model '${model}' does not exist`,
        'model',
      )
    if (sleeping)
      throw proxyError(
        503,
        'service_unavailable',
        'model_sleeping',
        `Model '${model}' is sleeping; wake it first`,
        undefined,
        {
          'retry-after': RETRY_AFTER_SLEEPING,
        },
      )
    const why = starting ? 'is still loading' : 'is not ready'
    throw proxyError(503, 'service_unavailable', 'model_not_ready', `Model '${model}' ${why}`, undefined, {
      'retry-after': RETRY_AFTER_STARTING,
    })
  }

  acquireByPort(port: number): Lease | null {
    for (const inst of this.instances.values()) {
      if (inst.row.port !== port) continue
      if (inst.status === 'failed' || inst.status === 'stopping') return null
      return this.lease(inst)
    }
    return null
  }

  // ---- lifecycle ----

  /** live: the instance is still the registered one (an unload may have removed it during an await). */
  private live(inst: ManagedInstance): boolean {
    return this.instances.get(inst.id) === inst
  }

  private persist(inst: ManagedInstance): void {
    if (this.live(inst)) this.deps.repo.save(inst.row)
  }

  private setStatus(inst: ManagedInstance, next: InstanceStatus, message: string): void {
    if (!this.live(inst)) return
    const previous = inst.status
    inst.row.status = next
    this.persist(inst)
    inst.events.emit('status', { previousStatus: previous, currentStatus: next, message })
    this.deps.bus.emit('gateway.instance.status', {
      instance: inst.record(),
      previousStatus: previous,
      currentStatus: next,
      message,
    })
    this.deps.log.info(`instance ${inst.id}: ${previous} → ${next}`, { message })
  }

  private track<T>(p: Promise<T>): void {
    const tracked = p.catch((err) => this.deps.log.error('background task failed', { error: String(err) }))
    this.background.add(tracked)
    tracked.finally(() => this.background.delete(tracked))
  }

  /** pendingMibByGpu: what engines still loading will claim beyond what nvidia-smi already shows. */
  pendingMibByGpu(snapshot: GpuSnapshot): Map<number, number> {
    const pending = new Map<number, number>()
    if (!snapshot.available) return pending
    for (const inst of this.instances.values()) {
      if (inst.status !== 'starting' || inst.row.sharedcache_enabled) continue
      const seen = usedMibByGpuForPids(
        snapshot.gpus,
        snapshot.apps,
        new Set(inst.row.pgid ? groupPids(inst.row.pgid) : []),
      )
      for (const idx of inst.row.gpu_ids) {
        const g = snapshot.gpus.find((x) => x.index === idx)
        if (!g?.memoryTotalMib) continue
        const claim = Math.max(0, inst.row.gpu_memory_utilization * g.memoryTotalMib - (seen.get(idx) ?? 0))
        pending.set(idx, (pending.get(idx) ?? 0) + claim)
      }
    }
    return pending
  }

  private validateArgs(req: LoadRequest): { extra: string[]; port: number | null } {
    const tp = req.tensor_parallel_size ?? 1
    if (req.gpu_ids) {
      if (new Set(req.gpu_ids).size !== req.gpu_ids.length) throw badRequest('gpu_ids must not repeat a GPU')
      if (req.gpu_ids.length !== tp)
        throw badRequest(
          `tensor_parallel_size (${tp}) must equal the number of gpu_ids (${req.gpu_ids.length})`,
        )
    }
    let extra = [...(req.extra_args ?? [])]
    for (const flag of MANAGED_FLAGS) {
      if (hasFlag(extra, flag))
        throw badRequest(`extra_args must not set ${flag}; use the load request's own field instead`)
    }
    let port: number | null = null
    const portArg = findFlagValue(extra, '--port')
    if (portArg !== undefined) {
      port = Number(portArg)
      if (!Number.isInteger(port) || port < 1 || port > 65535)
        throw badRequest(`extra_args --port ${portArg} is not a port`)
      extra = removeFlag(extra, '--port')
    }
    return { extra, port }
  }

  private choosePort(requested: number | null): number {
    const taken = new Set(
      [...this.instances.values()].filter((i) => i.status !== 'failed').map((i) => i.row.port),
    )
    if (requested !== null) {
      if (taken.has(requested))
        throw conflict(`An instance already exists on port ${requested}`, 'MODEL_ALREADY_EXISTS')
      if (!portIsFree(this.deps.config.engine.host, requested))
        throw conflict(`Port ${requested} is in use by another process`, 'PORT_IN_USE')
      return requested
    }
    const port = this.ports.allocate(taken)
    if (port === null) {
      const { start, end } = this.deps.config.engine.port_range
      throw conflict(`No free port in the engine port range ${start}-${end}`, 'NO_FREE_PORT')
    }
    return port
  }

  /** place picks the GPUs for a load from a snapshot, counting what loads in progress will claim. */
  private place(snapshot: GpuSnapshot, req: LoadRequest, tp: number, util: number, sharedCache: boolean) {
    if (!snapshot.available) {
      return { gpuIds: req.gpu_ids ?? Array.from({ length: tp }, (_, i) => i), deviceTotalGib: undefined }
    }
    const gpuIds = placeOnGpus(snapshot.gpus, {
      ...(req.gpu_ids ? { gpuIds: req.gpu_ids } : {}),
      tensorParallelSize: tp,
      gpuMemoryUtilization: util,
      sharedCache,
      pendingMibByGpu: this.pendingMibByGpu(snapshot),
    })
    const total = snapshot.gpus.find((g) => g.index === gpuIds[0])?.memoryTotalMib
    return { gpuIds, deviceTotalGib: total ? total / 1024 : undefined }
  }

  /**
   * load validates, places and spawns an engine. `opts.routable: false` keeps a new instance out of
   * routing until someone turns it on (the blue-green move's target).
   */
  async load(req: LoadRequest, opts: { routable?: boolean; busy?: string } = {}): Promise<LoadResponse> {
    if (this.stopping) throw new AppError(503, 'SHUTTING_DOWN', 'modelgate is shutting down')
    const { config } = this.deps
    const tp = req.tensor_parallel_size ?? 1
    const { extra, port: requestedPort } = this.validateArgs(req)
    const util = req.gpu_memory_utilization ?? config.engine.gpu_memory_utilization
    const sharedCache = config.sharedcache.enabled && tp === 1
    if (requestedPort !== null) this.choosePort(requestedPort) // a taken port is refused before any GPU work
    const snapshot = await this.probe.snapshot()
    if (!snapshot.available)
      this.deps.log.warn('GPU probe unavailable; loading without placement checks', {
        reason: snapshot.reason,
      })
    const place = () => this.place(snapshot, req, tp, util, sharedCache)
    if (this.preloadCheck && !req.force) await this.preloadCheck(req, place().gpuIds)
    // From here to registration nothing awaits: two loads arriving together can never both count
    // the same free memory or the same port (the second sees the first as a pending claim).
    const { gpuIds, deviceTotalGib } = place()
    const port = this.choosePort(requestedPort)
    const modelName = shortModelName(req.model_path)
    const id = `${slug(modelName)}-${randomBytes(3).toString('hex')}`
    const servedName = req.served_model_name ?? req.model_path
    const argv = [
      ...expandSelf(config.engine.command, this.deps.selfCommand),
      ...buildVllmArgs({
        modelPath: req.model_path,
        port,
        host: config.engine.host,
        servedModelName: servedName,
        ...(req.max_tokens ? { maxModelLen: req.max_tokens } : {}),
        gpuMemoryUtilization: util,
        tensorParallelSize: tp,
        enableSleepMode: req.enable_sleep_mode === true,
        sharedCache,
        extraArgs: extra,
      }),
    ]
    const env = {
      ...process.env,
      ...config.engine.env,
      ...buildEngineEnv({
        gpuIds,
        enableSleepMode: req.enable_sleep_mode === true,
        sharedCache,
        sharedCacheName: sharedCacheSegmentName(gpuIds),
      }),
    }
    const now = new Date().toISOString()
    const row: InstanceRow = {
      id,
      model_path: req.model_path,
      model_name: modelName,
      served_model_name: servedName,
      status: 'starting',
      port,
      pid: null,
      pgid: null,
      process_start_time: null,
      max_tokens: req.max_tokens ?? null,
      requested_max_tokens: req.max_tokens ?? null,
      gpu_memory_utilization: util,
      gpu_ids: gpuIds,
      tensor_parallel_size: tp,
      sharedcache_enabled: sharedCache,
      enable_sleep_mode: req.enable_sleep_mode === true,
      sleep_level: null,
      slept_at: null,
      extra_args: req.extra_args ?? [],
      launch_argv: argv,
      launch_command: quoteCommand(argv),
      log_dir: join(this.deps.dataDir, 'engines', id),
      loaded_at: now,
      ready_at: null,
      error: null,
      memory_metrics: null,
      memory_baseline_by_gpu: null,
      updated_at: now,
    }
    const inst = this.newInstance(row, deviceTotalGib)
    inst.routable = opts.routable ?? true
    inst.busy = opts.busy ?? null
    this.instances.set(id, inst)
    try {
      inst.process = EngineProcess.spawn({
        argv,
        env,
        logs: ManagedInstance.logFiles(row.log_dir),
        onLine: (stream, line) => this.onLogLine(inst, stream, line),
      })
    } catch (err) {
      this.instances.delete(id)
      throw badRequest(`could not start the engine: ${(err as Error).message}`, 'ENGINE_SPAWN_FAILED')
    }
    row.pid = inst.process.pid
    row.pgid = inst.process.pgid
    row.process_start_time = inst.process.startTime
    this.persist(inst)
    inst.events.emit('status', {
      previousStatus: null,
      currentStatus: 'starting',
      message: `launching ${row.launch_command}`,
    })
    this.deps.bus.emit('gateway.instance.status', {
      instance: inst.record(),
      previousStatus: null,
      currentStatus: 'starting',
      message: 'launching',
    })
    this.deps.log.info(`instance ${id}: starting`, { model: req.model_path, port, gpus: gpuIds.join(',') })
    this.watchExit(inst)
    this.track(this.awaitReady(inst, Date.parse(now) + config.engine.startup_timeout_seconds * 1000))
    return { status: 'starting', model: req.model_path, port, loaded_at: now, instance_id: id }
  }

  private newInstance(row: InstanceRow, deviceTotalGib?: number): ManagedInstance {
    const { config } = this.deps
    return new ManagedInstance(row, config.engine.host, config.engine.log_buffer_lines, {
      ...(row.sharedcache_enabled ? {} : { gpuMemoryUtilization: row.gpu_memory_utilization }),
      ...(deviceTotalGib ? { deviceTotalGib } : {}),
    })
  }

  private onLogLine(inst: ManagedInstance, stream: LogStream, line: string): void {
    inst.events.emit('log', { stream, content: line })
    inst.logs.feed(line)
    if (inst.status === 'starting') {
      const percent = inst.logs.progressPercent()
      if (percent !== inst.lastProgress) {
        inst.lastProgress = percent
        inst.events.emit('progress', { phase: inst.logs.phase(), percent, message: line.slice(0, 300) })
      }
    }
  }

  /** awaitReady polls /health until 200 (active), the process exits (failed) or the deadline (failed). */
  private async awaitReady(inst: ManagedInstance, deadlineAt: number): Promise<void> {
    const { config } = this.deps
    const proc = inst.process!
    const outcome = await waitHealthy(inst.client, {
      initialMs: config.engine.health_poll_ms.initial,
      maxMs: config.engine.health_poll_ms.max,
      deadlineMs: Math.max(0, deadlineAt - Date.now()),
      stop: () => !proc.running || inst.status !== 'starting',
    })
    if (inst.status !== 'starting') return
    if (outcome === 'healthy') {
      await this.markReady(inst)
      return
    }
    if (outcome === 'timeout') {
      const msg = `engine did not become healthy within ${config.engine.startup_timeout_seconds} s`
      this.fail(inst, msg)
      await proc.stop(config.engine.stop_grace_seconds * 1000)
      return
    }
    // the process exited: the exit watcher records the failure
  }

  private async markReady(inst: ManagedInstance): Promise<void> {
    const row = inst.row
    row.ready_at = new Date().toISOString()
    row.memory_metrics = inst.logs.metrics()
    row.max_tokens = inst.logs.maxModelLen() ?? row.requested_max_tokens
    row.memory_baseline_by_gpu = await this.measureFootprint(inst)
    if (!this.live(inst) || inst.status !== 'starting') return
    inst.events.emit('progress', { phase: 'ready', percent: 100, message: 'engine is healthy' })
    this.setStatus(inst, 'active', 'engine is healthy')
    this.emitMemory(inst, row.memory_baseline_by_gpu)
  }

  /** measureFootprint: GiB per GPU held by the engine's process group, else the log-derived total. */
  private async measureFootprint(inst: ManagedInstance): Promise<Record<string, number> | null> {
    const row = inst.row
    this.probe.invalidate()
    const snap = await this.probe.snapshot()
    const out: Record<string, number> = {}
    if (snap.available && row.pgid) {
      const used = usedMibByGpuForPids(snap.gpus, snap.apps, new Set(groupPids(row.pgid)))
      for (const idx of row.gpu_ids) {
        const mib = used.get(idx)
        if (mib !== undefined) out[String(idx)] = Math.round((mib / 1024) * 100) / 100
      }
    }
    if (Object.keys(out).length === row.gpu_ids.length) return out
    const total = row.memory_metrics?.total_gpu_memory_gib
    if (total === undefined) return Object.keys(out).length ? out : null
    for (const idx of row.gpu_ids) out[String(idx)] ??= Math.round(total * 100) / 100
    return out
  }

  private emitMemory(inst: ManagedInstance, byGpu: Record<string, number> | null): void {
    inst.currentMemoryGib = byGpu
    const total = byGpu ? Object.values(byGpu).reduce((a, b) => a + b, 0) : null
    inst.events.emit('memory', {
      gpu_ids: inst.row.gpu_ids,
      memory_used_gib_by_gpu: byGpu,
      total_memory_used_gib: total === null ? null : Math.round(total * 100) / 100,
      status: inst.status,
      memory_metrics: inst.row.memory_metrics ?? null,
    })
  }

  private fail(inst: ManagedInstance, message: string): void {
    inst.row.error = message
    inst.routable = false
    inst.events.emit('error', { message, source: 'engine' })
    this.setStatus(inst, 'failed', message)
  }

  /** watchExit turns an unexpected engine exit into a failed instance with its last error lines. */
  private watchExit(inst: ManagedInstance): void {
    const proc = inst.process!
    void proc.exited.then(async (code) => {
      proc.flushLogs()
      if (inst.status === 'stopping' || inst.status === 'failed' || !this.instances.has(inst.id)) return
      const wasStarting = inst.status === 'starting'
      const reason = wasStarting
        ? (inst.logs.startupFailure() ?? `engine exited with code ${code ?? 'unknown'} during start-up`)
        : [`engine exited unexpectedly (code ${code ?? 'unknown'})`, ...inst.logs.lastErrorLines(5)].join(
            '\n',
          )
      this.fail(inst, reason)
      // The leader is gone; its workers may still hold GPU memory. Stop the rest of the group.
      await proc.stop(this.deps.config.engine.stop_grace_seconds * 1000)
      this.cleanupSharedCache(inst)
    })
  }

  async unload(id: string): Promise<void> {
    const inst = this.require(id)
    if (inst.status === 'stopping') return
    if (inst.busy === 'move') throw conflict(`Instance ${id} is being moved`, 'OPERATION_IN_PROGRESS')
    inst.routable = false
    this.setStatus(inst, 'stopping', 'unload requested')
    this.track(this.finishUnload(inst))
  }

  private async finishUnload(inst: ManagedInstance): Promise<void> {
    const grace = this.deps.config.engine.stop_grace_seconds * 1000
    const segment = inst.row.sharedcache_enabled ? this.snapshotSegment(inst) : null
    if (inst.process) await inst.process.stop(grace)
    else if (inst.row.pgid && sameProcess(inst.row.pid ?? -1, inst.row.process_start_time))
      await stopGroup(inst.row.pgid, grace)
    this.restoreSharedCache(inst, segment)
    this.remove(inst, 'unloaded')
  }

  private remove(inst: ManagedInstance, message: string): void {
    this.instances.delete(inst.id)
    this.deps.repo.delete(inst.id)
    const previous = inst.status
    inst.events.emit('status', { previousStatus: previous, currentStatus: 'removed', message })
    inst.events.end()
    this.deps.bus.emit('gateway.instance.status', {
      instance: inst.record(),
      previousStatus: previous,
      currentStatus: 'removed',
      message,
    })
    this.deps.log.info(`instance ${inst.id}: removed`, { message })
  }

  // ---- shared KV cache pool bookkeeping ----

  private othersOnSegment(inst: ManagedInstance): ManagedInstance[] {
    const name = sharedCacheSegmentName(inst.row.gpu_ids)
    return [...this.instances.values()].filter(
      (o) =>
        o !== inst &&
        o.row.sharedcache_enabled &&
        o.status !== 'failed' &&
        sharedCacheSegmentName(o.row.gpu_ids) === name,
    )
  }

  private snapshotSegment(inst: ManagedInstance) {
    return readKvcachedSegment(sharedCacheSegmentName(inst.row.gpu_ids), this.deps.config.sharedcache.shm_dir)
  }

  /**
   * restoreSharedCache: an engine removes the pool's segment on SIGTERM even when others still use
   * it. If others remain, put the segment back as it was; if none remain, remove a stale one.
   */
  private restoreSharedCache(inst: ManagedInstance, before: ReturnType<typeof readKvcachedSegment>): void {
    if (!inst.row.sharedcache_enabled) return
    const name = sharedCacheSegmentName(inst.row.gpu_ids)
    const dir = this.deps.config.sharedcache.shm_dir
    if (this.othersOnSegment(inst).length === 0) {
      removeKvcachedSegment(name, dir)
      return
    }
    if (before && !readKvcachedSegment(name, dir)) {
      writeKvcachedSegment(name, before, dir)
      this.deps.log.info('restored the shared KV cache segment removed by a departing engine', {
        segment: name,
      })
    }
  }

  private cleanupSharedCache(inst: ManagedInstance): void {
    if (inst.row.sharedcache_enabled && this.othersOnSegment(inst).length === 0)
      removeKvcachedSegment(sharedCacheSegmentName(inst.row.gpu_ids), this.deps.config.sharedcache.shm_dir)
  }

  // ---- sleep and wake ----

  private beginOp(inst: ManagedInstance, op: string): void {
    if (inst.busy)
      throw conflict(`Instance ${inst.id} is busy (${inst.busy} in progress)`, 'OPERATION_IN_PROGRESS')
    inst.busy = op
  }

  async sleep(id: string, level: 1 | 2): Promise<SleepResult> {
    const inst = this.require(id)
    if (inst.status !== 'active')
      throw conflict(`Instance ${id} is ${inst.status}; only a running instance can sleep`, 'INVALID_STATE')
    if (!inst.row.enable_sleep_mode)
      throw badRequest(`Instance ${id} was loaded without enable_sleep_mode`, 'SLEEP_MODE_NOT_ENABLED')
    this.beginOp(inst, 'sleep')
    try {
      await this.engineCall(() => inst.client.sleep(level))
      this.stillThere(inst, 'active')
      const now = new Date().toISOString()
      inst.row.sleep_level = level
      inst.row.slept_at = now
      this.setStatus(inst, 'sleeping', `sleep level ${level}`)
      this.emitMemory(inst, await this.measureFootprint(inst))
      return {
        status: 'sleeping',
        instance_id: id,
        model_path: inst.row.model_path,
        sleep_level: level,
        slept_at: now,
      }
    } finally {
      inst.busy = null
    }
  }

  async wake(id: string, tags: string[] = []): Promise<WakeResult> {
    const inst = this.require(id)
    if (inst.status !== 'sleeping')
      throw conflict(
        `Instance ${id} is ${inst.status}; only a sleeping instance can be woken`,
        'INVALID_STATE',
      )
    this.beginOp(inst, 'wake')
    try {
      await this.engineCall(() => inst.client.wake(tags))
      const stillSleeping = await this.engineCall(() => inst.client.isSleeping())
      this.stillThere(inst, 'sleeping')
      const now = new Date().toISOString()
      if (!stillSleeping) {
        inst.row.sleep_level = null
        inst.row.slept_at = null
        this.setStatus(inst, 'active', tags.length ? `woke (${tags.join(', ')})` : 'woke')
      } else {
        inst.events.emit('progress', { phase: 'waking', percent: 50, message: `woke ${tags.join(', ')}` })
      }
      this.emitMemory(inst, await this.measureFootprint(inst))
      return {
        status: stillSleeping ? 'sleeping' : 'running',
        instance_id: id,
        model_path: inst.row.model_path,
        woke_at: now,
        ...(tags.length ? { tags } : {}),
      } as WakeResult
    } finally {
      inst.busy = null
    }
  }

  /** stopBudgetMs bounds an unload: SIGTERM grace, then SIGKILL and its wait, plus a margin. */
  stopBudgetMs(): number {
    return this.deps.config.engine.stop_grace_seconds * 1000 + 10_000
  }

  /** stillThere: after an engine call, the instance was not unloaded (or failed) meanwhile. */
  private stillThere(inst: ManagedInstance, status: InstanceStatus): void {
    if (!this.live(inst) || inst.status !== status)
      throw conflict(`Instance ${inst.id} became ${inst.status} during the operation`, 'INVALID_STATE')
  }

  /** sleepStatus is the sleep-status body (spec: not shown; documented in the README). */
  async sleepStatus(id: string) {
    const inst = this.require(id)
    let engineSleeping: boolean | null = null
    if (inst.status === 'active' || inst.status === 'sleeping') {
      engineSleeping = inst.row.enable_sleep_mode ? await inst.client.isSleeping().catch(() => null) : false
    }
    return {
      instance_id: id,
      status: inst.status,
      is_sleeping: inst.status === 'sleeping',
      sleep_level: (inst.row.sleep_level as 1 | 2 | null) ?? null,
      slept_at: inst.row.slept_at,
      enable_sleep_mode: inst.row.enable_sleep_mode,
      engine_is_sleeping: engineSleeping,
    }
  }

  private async engineCall<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn()
    } catch (err) {
      if (err instanceof EngineCallError) throw new AppError(502, 'ENGINE_ERROR', err.message, 'server_error')
      throw err
    }
  }

  // ---- start-up recovery and shutdown ----

  /** recover re-adopts healthy engines of a previous run and stops the others; never signals a reused pid. */
  async recover(): Promise<void> {
    const rows = this.deps.repo.all()
    for (const row of rows) {
      if (row.status === 'failed') {
        this.instances.set(row.id, this.newInstance(row))
        continue
      }
      const alive = row.pid !== null && sameProcess(row.pid, row.process_start_time)
      const inst = this.newInstance(row)
      if (!alive) {
        this.instances.set(row.id, inst)
        row.status === 'stopping'
          ? this.remove(inst, 'engine gone after restart')
          : this.fail(inst, 'engine exited while modelgate was not running')
        this.cleanupSharedCache(inst)
        continue
      }
      const healthy = await inst.client.health(2000)
      const deadline = Date.parse(row.loaded_at) + this.deps.config.engine.startup_timeout_seconds * 1000
      const stillLoading = row.status === 'starting' && Date.now() < deadline
      if (row.status === 'stopping' || (!healthy && !stillLoading)) {
        this.deps.log.warn(`stopping engine left by a previous run`, { instance: row.id, pid: row.pid })
        await stopGroup(row.pgid ?? row.pid!, this.deps.config.engine.stop_grace_seconds * 1000)
        this.instances.set(row.id, inst)
        this.remove(inst, 'stopped after restart (unhealthy)')
        this.cleanupSharedCache(inst)
        continue
      }
      inst.process = EngineProcess.adopt(
        row.pid!,
        row.pgid ?? row.pid!,
        row.process_start_time!,
        ManagedInstance.logFiles(row.log_dir),
        (stream, line) => this.onLogLine(inst, stream, line),
      )
      this.instances.set(row.id, inst)
      this.watchExit(inst)
      this.deps.log.info(`re-adopted engine from a previous run`, {
        instance: row.id,
        pid: row.pid,
        port: row.port,
      })
      if (row.status === 'starting') {
        this.track(this.awaitReady(inst, deadline))
      } else if (row.enable_sleep_mode) {
        const sleeping = await inst.client.isSleeping().catch(() => row.status === 'sleeping')
        if (sleeping !== (row.status === 'sleeping')) {
          if (!sleeping) {
            row.sleep_level = null
            row.slept_at = null
          }
          this.setStatus(inst, sleeping ? 'sleeping' : 'active', 're-adopted after restart')
        }
      }
    }
  }

  /** stop unloads every engine (TERM then KILL per group) within the shutdown deadline. */
  async stop(deadline: AbortSignal): Promise<void> {
    this.stopping = true
    const grace = this.deps.config.engine.stop_grace_seconds * 1000
    await Promise.all(
      [...this.instances.values()].map(async (inst) => {
        if (inst.status === 'failed') {
          inst.process?.close()
          return
        }
        inst.routable = false
        if (inst.status !== 'stopping') this.setStatus(inst, 'stopping', 'modelgate shutting down')
        if (deadline.aborted) inst.process?.kill()
        else if (inst.process) await inst.process.stop(grace)
        this.remove(inst, 'modelgate shut down')
      }),
    )
    await Promise.allSettled([...this.background])
  }

  /** kill: synchronous SIGKILL of every engine group (forced exit). */
  kill(): void {
    for (const inst of this.instances.values()) inst.process?.kill()
  }
}

/** InstanceLease: one in-flight request on an instance; release is idempotent. */
class InstanceLease implements Lease {
  readonly instanceId: string
  readonly servedModelName: string
  readonly baseUrl: string
  private released = false

  constructor(private readonly inst: ManagedInstance) {
    this.instanceId = inst.row.id
    this.servedModelName = inst.row.served_model_name
    this.baseUrl = inst.baseUrl
  }

  release(): void {
    if (this.released) return
    this.released = true
    this.inst.inFlight--
  }
}
