import type { Backend } from '../../src/directory/backend.ts'
import { orderBackends } from '../../src/directory/order.ts'
import type { SleepTag } from '../../src/engine/engine-client.ts'
import { engineDriver } from '../../src/engine/kinds.ts'
import { PortAllocator, type PortClaim } from '../../src/engine/ports.ts'
import { groupPids } from '../../src/engine/process.ts'
import { EngineProcess } from '../../src/engine/supervisor.ts'
import { defaultShmDir } from '../../src/gpu/kvcached.ts'
import { GpuProbe, type GpuSnapshot } from '../../src/gpu/smi.ts'
import type { EventBus } from '../../src/host/bus.ts'
import type { Logger } from '../../src/host/logger.ts'
import { PhaseSpans, type SpanBase, type TraceSpan } from '../../src/host/telemetry/spans.ts'
import { Telemetry } from '../../src/host/telemetry/telemetry.ts'
import { AppError, badRequest, conflict, modelNotFound, storageFull } from '../../src/http/errors.ts'
import type {
  CatalogEntry,
  CatalogEntryFields,
  GatewayApi,
  InstanceRecord,
  InstanceStatus,
  Lease,
  LoadOptions,
  LoadRequest,
  LoadResponse,
  SleepOptions,
  SleepResult,
  WakeResult,
} from './api.ts'
import type { CatalogStore } from './catalog/store.ts'
import { expandSelf, type GatewayConfig } from './config.ts'
import type { InstanceRow } from './db/schema.ts'
import { ManagedInstance } from './instance.ts'
import { type InstanceControl, ManagedHandle } from './instance-handle.ts'
import { checkArgs, launchPlan } from './launch.ts'
import type { Change, InstanceState, WaitOptions } from './lifecycle.ts'
import { MoveManager } from './move/service.ts'
import { placeOnGpus, sharedCacheEstimate, startingClaimMib, usedMibByGpuForPids } from './placement.ts'
import { GATEWAY_ANSWERS } from './proxy/answers.ts'
import { InstanceBackend } from './proxy/instance-backend.ts'
import { recover } from './recovery.ts'
import type { InstanceRepo } from './repo.ts'
import type { ResidencyHooks } from './residency/hooks.ts'
import { SharedCache } from './shared-cache.ts'
import { SleepWake } from './sleep-wake.ts'
import { Supervision } from './supervision.ts'

/** PreloadCheck runs after placement and before spawning; it throws an AppError to refuse a load. */
export type PreloadCheck = (req: LoadRequest, gpuIds: number[]) => Promise<void>

export interface GatewayDeps {
  config: GatewayConfig
  repo: InstanceRepo
  bus: EventBus
  log: Logger
  dataDir: string
  selfCommand: readonly string[]
  /** engineEnv: what the settings add to a new engine's environment (HF_TOKEN). */
  engineEnv?: () => Record<string, string>
  /** telemetry: spans of loads, sleeps, wakes and moves (default off). */
  telemetry?: Telemetry
  /** probe: this host's nvidia-smi (gpuProbe), which the catalogue and the pre-load check read too. */
  probe: GpuProbe
  /** preloadCheck: the memory-profile feature's check of a load (a seam: placement stays independent of it). */
  preloadCheck: PreloadCheck | null
  /** catalogue: the models this host may serve on demand (catalog/store.ts). */
  catalogue: CatalogStore
}

/** gpuProbe: this host's nvidia-smi as the gateway's configuration describes it. */
export function gpuProbe(config: GatewayConfig, selfCommand: readonly string[]): GpuProbe {
  const smi = config.gpu.smi_command ? expandSelf(config.gpu.smi_command, selfCommand) : null
  return new GpuProbe(smi, { timeoutMs: config.gpu.timeout_ms, cacheMs: config.gpu.cache_ms })
}

const NONE: readonly Backend[] = Object.freeze([])

/**
 * GatewayService owns every engine instance: it validates and places loads, spawns engine process
 * groups, unloads them, hands out routing leases to the proxy, and reports every lifecycle change
 * (persisted row, the instance's event stream, the bus, the log). The jobs around it live beside it:
 * launch.ts (command line and row), supervision.ts (logs, readiness, footprint, exits),
 * sleep-wake.ts, shared-cache.ts, recovery.ts (engines left by a previous run), move/.
 *
 * It is abstract in one part only, its residency hooks: the residency manager is built on the
 * service, so the plugin's gateway (pod-gateway.ts) builds it in its own constructor.
 */
export abstract class GatewayService implements GatewayApi {
  readonly instances = new Map<string, ManagedInstance>()
  readonly probe: GpuProbe
  readonly supervision: Supervision
  readonly sharedCache: SharedCache
  private readonly sleepWake: SleepWake
  private readonly ports: PortAllocator
  private stopping = false
  private readonly preloadCheck: PreloadCheck | null
  /** moves runs blue-green moves of this service's instances. */
  readonly moves: MoveManager
  /** catalogue: the models this host may serve on demand (catalog/store.ts). */
  readonly catalogue: CatalogStore
  private readonly background = new Set<Promise<unknown>>()
  readonly telemetry: Telemetry

  constructor(private readonly deps: GatewayDeps) {
    const { config } = deps
    this.telemetry = deps.telemetry ?? Telemetry.OFF
    this.probe = deps.probe
    this.preloadCheck = deps.preloadCheck
    this.catalogue = deps.catalogue
    this.ports = new PortAllocator(
      config.engine.host,
      config.engine.port_range.start,
      config.engine.port_range.end,
    )
    this.sharedCache = new SharedCache(defaultShmDir(), () => this.instances.values(), deps.log)
    this.supervision = new Supervision(config, this.probe, this.sharedCache, deps.dataDir)
    this.sleepWake = new SleepWake({
      config: config.sleep,
      supervision: this.supervision,
      probe: this.probe,
      bus: deps.bus,
      log: deps.log,
      telemetry: this.telemetry,
      unload: (id) => this.unload(id),
      probeSpacingMs: config.gpu.cache_ms,
    })
    this.moves = new MoveManager(this, deps.bus, deps.log.child('move'), this.telemetry)
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

  gpuReading(): Promise<GpuSnapshot> {
    return this.probe.reading()
  }

  catalog(): CatalogEntry[] {
    return this.catalogue.list()
  }

  catalogEntry(name: string): CatalogEntry | undefined {
    return this.catalogue.get(name)
  }

  saveCatalogEntry(name: string, fields: CatalogEntryFields) {
    return this.catalogue.save(name, fields)
  }

  removeCatalogEntry(name: string): void {
    this.catalogue.remove(name)
  }

  /**
   * waitFor resolves with the instance's state once `ready` accepts it ('removed' for one that is
   * gone), woken by its lifecycle changes; it rejects on the signal or deadline (a WaitError).
   */
  async waitFor(
    id: string,
    ready: (s: InstanceState) => boolean,
    opts: WaitOptions = {},
  ): Promise<InstanceState> {
    const inst = this.instances.get(id)
    if (!inst) {
      if (ready('removed')) return 'removed'
      throw modelNotFound(id)
    }
    await inst.lifecycle.waitUntil((l) => ready(l.state), { what: `instance ${id}`, ...opts })
    return inst.lifecycle.state
  }

  // ---- routing leases (used by the proxy) ----

  private lease(inst: ManagedInstance): Lease {
    inst.lifecycle.acquire()
    return new InstanceLease(inst)
  }

  /**
   * acquire: a lease on the instance the model directory would pick for `model` now (the one order,
   * src/directory/order.ts), or the refusal the gateway's `/v1` would answer; it starts no wake. For
   * callers outside a request's path (tools, tests); requests go through the directory.
   */
  acquire(model: string): Lease {
    const best = orderBackends(this.backends(model))[0]
    const inst = best ? this.instances.get(best.key) : undefined
    if (!best || !inst) throw GATEWAY_ANSWERS.unknown(model)
    switch (best.readiness()) {
      case 'ready':
        return this.lease(inst)
      case 'asleep':
      case 'waking':
        throw GATEWAY_ANSWERS.waking(model, 5, `Model '${model}' is sleeping; wake it first`)
      case 'starting':
        throw GATEWAY_ANSWERS.starting(model, null)
      case 'absent':
        throw GATEWAY_ANSWERS.unknown(model)
      case 'unavailable':
        throw GATEWAY_ANSWERS.unavailable(model)
    }
  }

  /**
   * backends: the instances a client's `model` names (served name, id or model path), as the model
   * directory serves them (src/directory): their readiness, leases on the lifecycle's in-flight
   * count, and their one wake.
   */
  backends(name: string): readonly Backend[] {
    let out: Backend[] | null = null
    for (const inst of this.instances.values()) {
      const r = inst.row
      if (r.served_model_name !== name && r.id !== name && r.model_path !== name) continue
      if (out === null) out = []
      out.push(inst.backend)
    }
    return out ?? NONE
  }

  acquireByPort(port: number): Lease | null {
    for (const inst of this.instances.values()) {
      if (inst.row.port !== port) continue
      if (inst.status === 'failed' || inst.status === 'stopping') return null
      return this.lease(inst)
    }
    return null
  }

  // ---- lifecycle reporting ----

  /** report: the one place a lifecycle change becomes a persisted row, events and a log line. */
  private report(inst: ManagedInstance, change: Change): void {
    // The row follows the state first, so a lifecycle listener reading the record sees the new one.
    if (change.kind === 'state' && change.current !== 'removed') inst.row.status = change.current
    this.deps.bus.emit('gateway.instance.lifecycle', {
      instance_id: inst.id,
      served_model_name: inst.row.served_model_name,
      change,
      at: performance.now(),
    })
    if (change.kind !== 'state') return
    // The GPUs' last reading shows them as they were: a view waits for the next one (GpuProbe.reading).
    this.probe.invalidate()
    const { current, message } = change
    const previousStatus = change.previous as InstanceStatus
    if (current !== 'removed') {
      inst.row.status = current
      this.persist(inst, 'save', () => this.deps.repo.save(inst.row))
    }
    inst.events.emit('status', { previousStatus, currentStatus: current, message })
    if (current === 'removed') inst.events.end()
    this.deps.bus.emit('gateway.instance.status', {
      instance: inst.record(),
      previousStatus,
      currentStatus: current,
      message,
    })
    if (current === 'removed') this.deps.log.info(`instance ${inst.id}: removed`, { message })
    else this.deps.log.info(`instance ${inst.id}: ${previousStatus} → ${current}`, { message })
  }

  /**
   * persist writes a lifecycle change to the database, or logs why it could not (a full disk). The
   * change has already happened to the engine (it failed, stopped, slept), so it is reported all the
   * same: the registry in memory is what runs, and the row catches up at the next change that can be
   * written. A restart reconciles a stale row with the processes it finds (recovery.ts).
   */
  private persist(inst: ManagedInstance, what: 'save' | 'delete', write: () => void): void {
    try {
      write()
    } catch (err) {
      const full = storageFull(err)
      this.deps.log.error(
        `instance ${inst.id}: could not ${what} its row${full ? ': the disk is full' : ''}`,
        {
          error: full?.message ?? String(err),
        },
      )
    }
  }

  private newInstance(row: InstanceRow, deviceTotalGib?: number, opts: LoadOptions = {}): ManagedInstance {
    const { config } = this.deps
    return new ManagedInstance(
      row,
      config.engine.host,
      config.engine.log_buffer_lines,
      {
        ...(row.sharedcache_enabled ? {} : { gpuMemoryUtilization: row.gpu_memory_utilization }),
        ...(deviceTotalGib ? { deviceTotalGib } : {}),
      },
      (inst, change) => this.report(inst, change),
      opts,
      (inst) => new InstanceBackend(new ManagedHandle(inst, this.control)),
    )
  }

  /** control: an instance's sleep and (joinable) wake, and its queue, as its backend asks for them. */
  private readonly control: InstanceControl = {
    sleep: (inst, level, opts) => this.sleep(inst.id, level, opts),
    wake: (inst, trace) => this.wakeWithRoom(inst, trace),
    queue: (inst) => this.residency.queue(inst.row.served_model_name),
    abandoned: (inst) => this.residency.abandoned(inst.row.served_model_name),
    pinned: (inst) => this.residency.pinned(inst.row.served_model_name),
  }

  /** residency: the manager of what is resident, built on this service (pod-gateway.ts). */
  protected abstract readonly residency: ResidencyHooks

  /** wakeWithRoom: the instance's one wake, with room made first on its GPUs (residency). */
  private wakeWithRoom(inst: ManagedInstance, trace: SpanBase | null = null): Promise<WakeResult> {
    return this.residency.active
      ? this.residency.wake(inst, undefined, trace)
      : this.sleepWake.wake(inst, [], trace)
  }

  /** wakeEngine: the gateway's own wake of an instance, joinable (what residency runs once room is made). */
  wakeEngine(inst: ManagedInstance, trace: SpanBase | null = null): Promise<WakeResult> {
    return this.sleepWake.wake(inst, [], trace)
  }

  private track<T>(p: Promise<T>): void {
    const tracked = p.catch((err) => this.deps.log.error('background task failed', { error: String(err) }))
    this.background.add(tracked)
    tracked.finally(() => this.background.delete(tracked))
  }

  // ---- load ----

  /** rows: every registered instance's row (the measurements shared-cache estimates are read from). */
  private rows(): InstanceRow[] {
    return [...this.instances.values()].map((i) => i.row)
  }

  /** pendingMibByGpu: what engines still loading will claim beyond what nvidia-smi already shows. */
  pendingMibByGpu(snapshot: GpuSnapshot): Map<number, number> {
    const pending = new Map<number, number>()
    if (!snapshot.available) return pending
    const rows = this.rows()
    for (const inst of this.instances.values()) {
      if (inst.status !== 'starting') continue
      // A starting shared-cache engine claims its measured start allocation (kvcached checks nothing).
      const estimate = inst.row.sharedcache_enabled
        ? sharedCacheEstimate(rows, inst.row.model_path, inst.row.requested_max_tokens ?? undefined)
        : null
      const seen = usedMibByGpuForPids(
        snapshot.gpus,
        snapshot.apps,
        new Set(inst.row.pgid ? groupPids(inst.row.pgid) : []),
      )
      for (const idx of inst.row.gpu_ids) {
        const g = snapshot.gpus.find((x) => x.index === idx)
        if (!g?.memoryTotalMib) continue
        const claim = startingClaimMib(inst.row, g.memoryTotalMib, seen.get(idx) ?? 0, estimate)
        pending.set(idx, (pending.get(idx) ?? 0) + claim)
      }
    }
    return pending
  }

  /**
   * choosePort claims the port of a new instance (ports.ts): the one asked for, or one of the range.
   * The claim keeps the port bound until the engine is up or gone, so another modelgate sharing the
   * range on this host does not pick it meanwhile.
   */
  private choosePort(requested: number | null): PortClaim {
    const taken = new Set(
      [...this.instances.values()].filter((i) => i.status !== 'failed').map((i) => i.row.port),
    )
    if (requested !== null) {
      if (taken.has(requested))
        throw conflict(`An instance already exists on port ${requested}`, 'MODEL_ALREADY_EXISTS')
      const claim = this.ports.claim(requested)
      if (!claim) throw conflict(`Port ${requested} is in use by another process`, 'PORT_IN_USE')
      return claim
    }
    const claim = this.ports.allocate(taken)
    if (claim === null) {
      const { start, end } = this.deps.config.engine.port_range
      throw conflict(`No free port in the engine port range ${start}-${end}`, 'NO_FREE_PORT')
    }
    return claim
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
      sharedCacheEstimate: sharedCache
        ? sharedCacheEstimate(this.rows(), req.model_path, req.max_tokens)
        : null,
    })
    const total = snapshot.gpus.find((g) => g.index === gpuIds[0])?.memoryTotalMib
    return { gpuIds, deviceTotalGib: total ? total / 1024 : undefined }
  }

  /**
   * load validates, places and spawns an engine. `opts` sets how the instance starts out: a move's
   * target is not routed to and has its move running until the move switches to it.
   */
  async load(req: LoadRequest, opts: LoadOptions = {}): Promise<LoadResponse> {
    if (this.stopping) throw new AppError(503, 'SHUTTING_DOWN', 'modelgate is shutting down')
    const span = this.telemetry.operation(
      'gateway.load',
      {
        'gen_ai.request.model': req.served_model_name ?? req.model_path,
        'modelgate.model_path': req.model_path,
      },
      opts.trace,
    )
    const phases = new PhaseSpans(span)
    phases.enter('load.place')
    try {
      const res = await this.spawnLoad(req, opts, { span, phases })
      span.setAttributes({ 'modelgate.instance_id': res.instance_id, 'server.port': res.port })
      return res
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err)
      phases.end(message)
      span.end(message)
      throw err
    }
  }

  /** spawnLoad: the load itself; its engine's start-up is followed by supervision (`startup`: the trace). */
  private async spawnLoad(
    req: LoadRequest,
    opts: LoadOptions,
    startup: { span: TraceSpan; phases: PhaseSpans },
  ): Promise<LoadResponse> {
    const { config } = this.deps
    const tp = req.tensor_parallel_size ?? 1
    const kind = req.engine_kind ?? config.engine.kind
    const driver = engineDriver(kind)
    const { extra, port: requestedPort } = checkArgs(req, driver)
    const util = req.gpu_memory_utilization ?? config.engine.gpu_memory_utilization
    const sharedCache = config.sharedcache.enabled && tp === 1 && driver.capabilities.sharedCache
    // A taken port is refused before any GPU work (the claim is made again below, without an await).
    if (requestedPort !== null) this.choosePort(requestedPort).release()
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
    const claim = this.choosePort(requestedPort)
    const port = claim.port
    const { argv, env, row } = launchPlan(config, this.deps, req, {
      kind,
      driver,
      port,
      gpuIds,
      util,
      tp,
      sharedCache,
      extra,
    })
    const id = row.id
    const inst = this.newInstance(row, deviceTotalGib, opts)
    this.instances.set(id, inst)
    startup.span.setAttributes({ 'modelgate.gpu_ids': gpuIds.join(',') })
    startup.phases.enter('load.spawn')
    inst.startup = startup
    try {
      // An engine whose logs cannot be written is not started (on a full disk it would run blind).
      ManagedInstance.writeLaunchRecord(row)
      inst.process = EngineProcess.spawn({
        argv,
        env,
        logs: ManagedInstance.logFiles(row.log_dir),
        onLine: (stream, line) => this.supervision.onLogLine(inst, stream, line),
      })
    } catch (err) {
      this.instances.delete(id)
      claim.release()
      throw (
        storageFull(err, `the engine's log dir ${row.log_dir} could not be written; nothing was started`) ??
        badRequest(`could not start the engine: ${(err as Error).message}`, 'ENGINE_SPAWN_FAILED')
      )
    }
    row.pid = inst.process.pid
    row.pgid = inst.process.pgid
    row.process_start_time = inst.process.startTime
    try {
      this.deps.repo.save(row)
    } catch (err) {
      // An engine without its row would be unknown to the next start: stop it and forget the load.
      await this.supervision.stopEngine(inst)
      this.instances.delete(id)
      claim.release()
      this.deps.log.error(`instance ${id}: its row could not be written; its engine was stopped`, {
        error: String(err),
      })
      throw storageFull(err, 'the new instance could not be recorded; its engine was stopped') ?? err
    }
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
    this.supervision.watchExit(inst)
    // Once the engine listens (or is gone) its port needs no claim: its own socket holds it then.
    this.track(
      this.supervision
        .awaitReady(inst, Date.parse(row.loaded_at) + config.engine.startup_timeout_seconds * 1000)
        .finally(() => claim.release()),
    )
    return { status: 'starting', model: req.model_path, port, loaded_at: row.loaded_at, instance_id: id }
  }

  // ---- unload ----

  async unload(id: string): Promise<void> {
    const inst = this.require(id)
    if (inst.status === 'stopping') return
    if (inst.lifecycle.operation === 'move')
      throw conflict(`Instance ${id} is being moved`, 'OPERATION_IN_PROGRESS')
    inst.lifecycle.to('stopping', 'unload requested')
    this.track(this.finishUnload(inst))
  }

  private async finishUnload(inst: ManagedInstance): Promise<void> {
    // A failed instance too: what is left of its group (workers that outlived the leader) is stopped.
    await this.supervision.stopEngine(inst)
    this.sharedCache.cleanup(inst)
    this.remove(inst, 'unloaded')
  }

  /** remove: the engine is gone; idempotent (an unload and the shutdown may both get here). */
  private remove(inst: ManagedInstance, message: string): void {
    if (inst.lifecycle.state === 'removed') return
    this.instances.delete(inst.id)
    this.persist(inst, 'delete', () => this.deps.repo.delete(inst.id))
    inst.lifecycle.to('removed', message)
  }

  /** stopBudgetMs bounds an unload: SIGTERM grace, then SIGKILL and its wait, plus a margin. */
  stopBudgetMs(): number {
    return this.deps.config.engine.stop_grace_seconds * 1000 + 10_000
  }

  // ---- sleep and wake ----

  /** sleep: drain, sleep, check; an idle sleep (`why: 'idle'`) is the residency manager's rule. */
  sleep(id: string, level: 1 | 2, opts: SleepOptions = {}): Promise<SleepResult> {
    const inst = this.require(id)
    if (opts.why === 'idle') return this.residency.sleepIdle(inst, level, opts)
    return this.sleepWake.sleep(inst, level, opts)
  }

  /** sleepEngine: the gateway's own sleep of an instance (what the residency manager's idle rule runs). */
  sleepEngine(inst: ManagedInstance, level: 1 | 2, opts: SleepOptions): Promise<SleepResult> {
    return this.sleepWake.sleep(inst, level, opts)
  }

  wake(id: string, tags: string[] = [], trace: SpanBase | null = null): Promise<WakeResult> {
    const inst = this.require(id)
    if (tags.length === 0) return this.wakeWithRoom(inst, trace)
    return this.sleepWake.wake(inst, tags as SleepTag[], trace)
  }

  sleepStatus(id: string) {
    return this.sleepWake.status(this.require(id))
  }

  // ---- start-up recovery and shutdown ----

  recover(): Promise<void> {
    return recover({
      config: this.deps.config,
      log: this.deps.log,
      supervision: this.supervision,
      sharedCache: this.sharedCache,
      rows: () => this.deps.repo.all(),
      newInstance: (row) => this.newInstance(row),
      register: (inst) => this.instances.set(inst.id, inst),
      remove: (inst, message) => this.remove(inst, message),
      track: (p) => this.track(p),
    })
  }

  /** stop unloads every engine (TERM then KILL per group) within the shutdown deadline. */
  async stop(deadline: AbortSignal): Promise<void> {
    this.stopping = true
    this.supervision.halt()
    if (this.deps.config.engine.on_shutdown === 'leave') return this.leave()
    await Promise.all(
      [...this.instances.values()].map(async (inst) => {
        if (inst.status === 'failed') {
          inst.process?.close()
          return
        }
        if (inst.status !== 'stopping') inst.lifecycle.to('stopping', 'modelgate shutting down')
        if (deadline.aborted) inst.process?.kill()
        else await this.supervision.stopEngine(inst)
        this.remove(inst, 'modelgate shut down')
      }),
    )
    await Promise.allSettled([...this.background])
  }

  /**
   * leave: engine.on_shutdown `leave`: stop following the engines and leave them serving, their rows
   * as they are, for the next start on this data_dir to adopt (recovery.ts checks pid and start time).
   */
  private async leave(): Promise<void> {
    const left: string[] = []
    for (const inst of this.instances.values()) {
      inst.process?.close()
      if (inst.status !== 'failed' && inst.status !== 'stopping')
        left.push(`${inst.id} (${inst.status}, pid ${inst.row.pid})`)
    }
    if (left.length)
      this.deps.log.warn('leaving engines running for the next start to adopt (engine.on_shutdown: leave)', {
        instances: left.join(', '),
      })
    await Promise.allSettled([...this.background])
  }

  /** kill: synchronous SIGKILL of every engine group (forced exit), unless engines are to be left running. */
  kill(): void {
    if (this.deps.config.engine.on_shutdown === 'leave') return
    for (const inst of this.instances.values()) inst.process?.kill()
  }
}

/** InstanceLease: one in-flight request on an instance; release is idempotent. */
class InstanceLease implements Lease {
  readonly instanceId: string
  readonly servedModelName: string
  readonly baseUrl: string
  readonly contextTokens: number | null
  private released = false

  constructor(private readonly inst: ManagedInstance) {
    this.instanceId = inst.row.id
    this.servedModelName = inst.row.served_model_name
    this.baseUrl = inst.baseUrl
    this.contextTokens = inst.row.max_tokens ?? null
  }

  release(): void {
    if (this.released) return
    this.released = true
    this.inst.lifecycle.release()
  }
}
