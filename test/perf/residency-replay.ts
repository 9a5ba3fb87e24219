import { Value } from '@sinclair/typebox/value'
import { Registry } from 'prom-client'
import type { CatalogEntry } from '../../plugins/gateway/api.ts'
import type { ManagedInstance } from '../../plugins/gateway/instance.ts'
import { ManagedHandle } from '../../plugins/gateway/instance-handle.ts'
import { catalogSource } from '../../plugins/gateway/residency/catalog-backend.ts'
import type { ResidencyClock } from '../../plugins/gateway/residency/clock.ts'
import { ResidencyConfig } from '../../plugins/gateway/residency/config.ts'
import { type ResidencyDecision, ResidencyManager } from '../../plugins/gateway/residency/manager.ts'
import type { GatewayService } from '../../plugins/gateway/service.ts'
import { MAX_HOLDS } from '../../src/directory/directory.ts'
import { publishedSeconds } from '../../src/engine/vllm-timing.ts'
import { EventBus } from '../../src/host/bus.ts'
import { Logger } from '../../src/host/logger.ts'
import { insufficientMemory } from '../../src/http/errors.ts'
import { lookupModel, weightsGiB } from '../../src/sim/models.ts'
import type { TraceEvent } from './residency-trace.ts'

/**
 * The residency replay: the real ResidencyManager (and the planner and costs it reads) replays a
 * trace in virtual time. What it needs of the gateway (its instances, their lifecycles, the GPU
 * reading, load, sleep, wake, unload) is a model of the engine here (ReplayGateway), and the clock
 * it reads and sets timers on is a VirtualClock (ResidencyClock, plugins/gateway/residency/clock.ts):
 * the next timer fires as soon as every promise the last one started has settled, so a run of 30
 * simulated minutes takes a fraction of a second and the same trace gives the same figures on any
 * machine. Requests reach the manager the way the model directory hands them over: an absent model
 * through its catalogue backend (catalog-backend.ts, a load), an instance through its ManagedHandle
 * (instance-handle.ts, a wake with room made), one wake run per model joined by every request held
 * for it, each request waiting at most queue_timeout_seconds in a queue of max_queue per model
 * (beyond it: 429 queue_full) and at most MAX_HOLDS times when its model is evicted again before
 * its turn. Not modelled: the directory's refusals for a while after a failed wake or load, and
 * the key priorities of its queue.
 *
 * Engine time (vLLM's, as the simulator takes it at SIM_TIME_SCALE): a cold load, a level-1 and a
 * level-2 wake take vLLM's published figures for the weights' size (src/engine/vllm-timing.ts).
 * vLLM publishes no sleep figure; this replay's own (SLEEP_SECONDS): a level-1 sleep copies the
 * weights to host RAM, the copy its wake makes the other way, so it takes as long as a level-1 wake
 * (0.2 s + 0.04 s/GiB); a level-2 sleep discards them (0.2 s). A sleeping engine keeps 1.2 GiB per
 * GPU (its CUDA context: "Sleep mode freed … GiB memory, 1.20 GiB memory is still in use", the
 * engine notes), an unload takes UNLOAD_SECONDS, a request is in flight for SERVE_SECONDS and its
 * first token comes the moment its model serves. modelgate's own time (drain, GPU readings, the
 * sleep check) is not in it: bench:lifecycle measures that, and the `--live` run includes it.
 *
 * The clairvoyant bound (clairvoyant()) runs on the same model of the engine, same durations and
 * memory, with a policy that knows every future request: on demand, the victim is the model asked
 * for farthest in the future (Belady), put to sleep at level 1 while host RAM allows, else at
 * level 2, sleeping models unloaded when their last 1.2 GiB is wanted; no min_resident_seconds.
 */

export const SLEEP_SECONDS = (level: 1 | 2, weightsGib: number) =>
  level === 1 ? 0.2 + 0.04 * weightsGib : 0.2
export const UNLOAD_SECONDS = 2
export const SERVE_SECONDS = 0.01
export const ASLEEP_MIB = Math.round(1.2 * 1024)
/** The simulator's 80 GB GPU as the engine sees it (79.6 GiB). */
export const GPU_TOTAL_MIB = Math.round(79.6 * 1024)
/** Virtual epoch ms of the replay's start (request times as the manager reads them). */
const EPOCH = Date.UTC(2026, 0, 1)

// ---- the clock ----

interface Timer {
  at: number
  seq: number
  fn: () => void
  cancelled: boolean
}

/**
 * VirtualClock: ms since the replay's start. Timers fire in the order of their time, then of their
 * setting; run() fires the next once every promise chain under way has settled (setImmediate runs
 * after the whole microtask queue), so nothing depends on how fast the machine is.
 */
export class VirtualClock implements ResidencyClock {
  t = 0
  private seq = 0
  private readonly heap: Timer[] = []

  now(): number {
    return EPOCH + this.t
  }
  mono(): number {
    return this.t
  }
  setTimeout(fn: () => void, ms: number): Timer {
    const timer = { at: this.t + Math.max(0, ms), seq: this.seq++, fn, cancelled: false }
    this.push(timer)
    return timer
  }
  clearTimeout(t: unknown): void {
    if (t) (t as Timer).cancelled = true
  }
  timeout(ms: number): AbortSignal {
    const ac = new AbortController()
    this.setTimeout(() => ac.abort(new DOMException('The operation timed out.', 'TimeoutError')), ms)
    return ac.signal
  }
  /** sleep: resolves `ms` virtual ms from now. */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.setTimeout(resolve, ms))
  }

  /** run: fire timers in order until none is left, or until `done()` says so after one fired. */
  async run(done: () => boolean = () => false): Promise<void> {
    for (;;) {
      await settle()
      if (done()) return
      const next = this.pop()
      if (!next) return
      if (next.cancelled) continue
      this.t = next.at
      next.fn()
    }
  }

  private less(a: Timer, b: Timer): boolean {
    return a.at < b.at || (a.at === b.at && a.seq < b.seq)
  }
  private push(x: Timer): void {
    const h = this.heap
    h.push(x)
    let i = h.length - 1
    while (i > 0) {
      const p = (i - 1) >> 1
      if (!this.less(h[i]!, h[p]!)) break
      ;[h[i], h[p]] = [h[p]!, h[i]!]
      i = p
    }
  }
  private pop(): Timer | undefined {
    const h = this.heap
    const top = h[0]
    const last = h.pop()
    if (h.length > 0 && last) {
      h[0] = last
      let i = 0
      for (;;) {
        const l = 2 * i + 1
        const r = l + 1
        let m = i
        if (l < h.length && this.less(h[l]!, h[m]!)) m = l
        if (r < h.length && this.less(h[r]!, h[m]!)) m = r
        if (m === i) break
        ;[h[i], h[m]] = [h[m]!, h[i]!]
        i = m
      }
    }
    return top
  }
}

const settle = () => new Promise<void>((resolve) => setImmediate(resolve))

// ---- the engine and the gateway's view of it ----

type State = 'starting' | 'active' | 'sleeping' | 'stopping' | 'removed'

export interface ReplayModel {
  name: string
  util: number
}

/** ReplayLifecycle: the part of an instance's lifecycle (lifecycle.ts) the manager and ManagedHandle read. */
class ReplayLifecycle {
  state: State = 'starting'
  operation: 'sleep' | 'wake' | null = null
  routing = false
  inFlight = 0
  private readonly waiters = new Set<() => void>()

  constructor(
    private readonly clock: VirtualClock,
    private readonly changed: () => void,
  ) {}

  get takesRequests(): boolean {
    return this.state === 'active' && this.routing && this.operation === null
  }
  route(on: boolean): void {
    this.routing = on
    this.notify()
  }
  acquire(): void {
    this.inFlight++
  }
  release(): void {
    this.inFlight--
    this.notify()
  }
  notify(): void {
    for (const w of [...this.waiters]) w()
    this.changed()
  }
  async drained(_opts?: { timeoutMs?: number }): Promise<void> {
    await this.waitUntil((l) => l.inFlight === 0, {})
  }
  waitUntil(
    pred: (l: ReplayLifecycle) => boolean,
    opts: { signal?: AbortSignal; timeoutMs?: number; what?: string },
  ): Promise<void> {
    if (pred(this)) return Promise.resolve()
    return new Promise((resolve, reject) => {
      const t = opts.timeoutMs
        ? this.clock.setTimeout(
            () => end(new Error(`timed out waiting for ${opts.what ?? 'it'}`)),
            opts.timeoutMs,
          )
        : null
      const end = (err?: unknown) => {
        this.waiters.delete(check)
        this.clock.clearTimeout(t)
        opts.signal?.removeEventListener('abort', onAbort)
        if (err) reject(err)
        else resolve()
      }
      const check = () => {
        if (pred(this)) end()
      }
      const onAbort = () => end(opts.signal?.reason ?? new Error('aborted'))
      if (opts.signal?.aborted) return onAbort()
      opts.signal?.addEventListener('abort', onAbort, { once: true })
      this.waiters.add(check)
    })
  }
}

/** ReplayInstance: the part of a ManagedInstance the manager and ManagedHandle read. */
class ReplayInstance {
  readonly lifecycle: ReplayLifecycle
  readonly driver = { capabilities: { sleepLevels: [1, 2] as const } }
  /** What it holds on each of its GPUs now (MiB). */
  heldMib: number
  sleepLevel: 1 | 2 | null = null
  wakeP: Promise<unknown> | null = null
  readonly row: Record<string, unknown> & {
    id: string
    served_model_name: string
    status: string
    gpu_ids: number[]
    sleep_level: number | null
  }

  constructor(
    readonly id: string,
    readonly model: ReplayModel,
    readonly gpuIds: number[],
    readonly claimMib: number,
    readonly weightsGib: number,
    evictable: boolean,
    clock: VirtualClock,
    changed: () => void,
  ) {
    this.heldMib = claimMib
    this.lifecycle = new ReplayLifecycle(clock, changed)
    this.row = {
      id,
      served_model_name: model.name,
      model_path: `org/${model.name}`,
      status: 'starting',
      gpu_ids: gpuIds,
      sleep_level: null,
      sharedcache_enabled: false,
      enable_sleep_mode: true,
      evictable,
      engine_kind: 'vllm',
      error: null,
      port: 0,
      loaded_at: new Date(EPOCH).toISOString(),
    }
  }
  get status(): string {
    return this.lifecycle.state
  }
  get baseUrl(): string {
    return 'http://replay.invalid'
  }
  get lastProgress(): number {
    return 0
  }
  holdsGibByGpu(): Record<string, number> {
    return Object.fromEntries(this.gpuIds.map((g) => [String(g), this.heldMib / 1024]))
  }
  record() {
    const gib = this.claimMib / 1024
    return {
      ...this.row,
      status: this.lifecycle.state,
      sleep_level: this.sleepLevel,
      memory_metrics: { weights_memory_gib: this.weightsGib, total_gpu_memory_gib: gib },
      memory_baseline_by_gpu: Object.fromEntries(this.gpuIds.map((g) => [String(g), gib])),
    }
  }
}

/** Counters a run reports. */
export interface EngineCounts {
  coldLoads: number
  wakes: number
  sleeps: number
  unloads: number
  /** GPU memory in use integrated over time (MiB·ms). */
  mibMs: number
}

/**
 * ReplayGateway: the gateway as the manager reads it (GatewayService's instances, get, list,
 * require, load, unload, sleep, wakeEngine, waitFor, gpuSnapshot, pendingMibByGpu, stopBudgetMs), on
 * the engine model above. Memory is exact: a load claims gpu_memory_utilization × the GPU when it
 * starts, a sleep leaves ASLEEP_MIB, a wake takes the claim back; a load or wake that finds less
 * free than it takes is refused INSUFFICIENT_MEMORY, as the gateway's placement check refuses it.
 */
export class ReplayGateway {
  readonly instances = new Map<string, ReplayInstance>()
  readonly counts: EngineCounts = { coldLoads: 0, wakes: 0, sleeps: 0, unloads: 0, mibMs: 0 }
  private nextId = 1
  private lastT = 0
  private readonly changeWaiters = new Set<() => void>()

  constructor(
    readonly clock: VirtualClock,
    readonly bus: EventBus,
    readonly gpus: number,
    readonly models: readonly ReplayModel[],
  ) {}

  usedMib(gpu: number): number {
    let n = 0
    for (const i of this.instances.values()) if (i.gpuIds.includes(gpu)) n += i.heldMib
    return n
  }

  /** account: GPU memory in use until now, before it changes. */
  private account(): void {
    let used = 0
    for (let g = 0; g < this.gpus; g++) used += this.usedMib(g)
    this.counts.mibMs += used * (this.clock.t - this.lastT)
    this.lastT = this.clock.t
  }

  finish(): void {
    this.account()
  }

  /** nextChange: resolves at the next lifecycle change of any instance or request end. */
  nextChange(): Promise<void> {
    return new Promise((resolve) => this.changeWaiters.add(resolve))
  }
  changed = (): void => {
    const ws = [...this.changeWaiters]
    this.changeWaiters.clear()
    for (const w of ws) w()
  }

  private report(inst: ReplayInstance, change: Record<string, unknown>): void {
    if (change.kind === 'state' && change.current !== 'removed') inst.row.status = change.current as string
    this.bus.emit('gateway.instance.lifecycle', {
      instance_id: inst.id,
      served_model_name: inst.model.name,
      change,
      at: this.clock.mono(),
    } as never)
    inst.lifecycle.notify()
  }

  private setState(inst: ReplayInstance, current: State): void {
    const previous = inst.lifecycle.state
    inst.lifecycle.state = current
    this.report(inst, { kind: 'state', previous, current })
  }

  private setOperation(inst: ReplayInstance, operation: 'sleep' | 'wake', running: boolean): void {
    inst.lifecycle.operation = running ? operation : null
    this.report(inst, { kind: 'operation', operation, running })
  }

  list() {
    return [...this.instances.values()].map((i) => i.record())
  }
  get(id: string) {
    return this.instances.get(id)?.record()
  }
  require(id: string): ReplayInstance {
    const i = this.instances.get(id)
    if (!i) throw new Error(`no instance ${id}`)
    return i
  }
  stopBudgetMs(): number {
    return 60_000
  }
  pendingMibByGpu(): Map<number, number> {
    return new Map()
  }
  async gpuSnapshot() {
    return {
      available: true as const,
      apps: [],
      takenAt: this.clock.now(),
      gpus: Array.from({ length: this.gpus }, (_, index) => {
        const used = this.usedMib(index)
        return {
          index,
          uuid: `GPU-${index}`,
          name: 'replay 80GB',
          memoryTotalMib: GPU_TOTAL_MIB,
          memoryUsedMib: used,
          memoryFreeMib: GPU_TOTAL_MIB - used,
          utilizationPercent: null,
          temperatureC: null,
        }
      }),
    }
  }

  async waitFor(
    id: string,
    ready: (s: string) => boolean,
    opts: { signal?: AbortSignal; timeoutMs?: number; what?: string } = {},
  ): Promise<string> {
    const inst = this.instances.get(id)
    if (!inst) {
      if (ready('removed')) return 'removed'
      throw new Error(`no instance ${id}`)
    }
    await inst.lifecycle.waitUntil((l) => ready(l.state), opts)
    return inst.lifecycle.state
  }

  weightsOf(model: ReplayModel): number {
    return weightsGiB(lookupModel(model.name))
  }

  claimOf(model: ReplayModel): number {
    return Math.ceil(model.util * GPU_TOTAL_MIB)
  }

  /** load: a cold load on `gpu_ids`, refused when they lack the claim; active after vLLM's load time. */
  async load(req: { served_model_name?: string; name?: string; gpu_ids?: number[]; evictable?: boolean }) {
    const name = req.served_model_name ?? req.name
    const model = this.models.find((m) => m.name === name)
    if (!model) throw new Error(`unknown model ${name}`)
    const gpuIds = req.gpu_ids ?? [0]
    const claim = this.claimOf(model)
    for (const g of gpuIds)
      if (GPU_TOTAL_MIB - this.usedMib(g) < claim)
        throw insufficientMemory(`GPU ${g} has ${GPU_TOTAL_MIB - this.usedMib(g)} MiB free, ${claim} needed`)
    this.account()
    const id = `i${this.nextId++}`
    const inst = new ReplayInstance(
      id,
      model,
      gpuIds,
      claim,
      this.weightsOf(model),
      req.evictable ?? true,
      this.clock,
      this.changed,
    )
    this.instances.set(id, inst)
    this.counts.coldLoads++
    this.bus.emit('gateway.instance.status', {
      instance: inst.record(),
      previousStatus: null,
      currentStatus: 'starting',
    } as never)
    this.clock.setTimeout(() => {
      if (inst.lifecycle.state !== 'starting') return
      inst.lifecycle.routing = true
      this.setState(inst, 'active')
    }, publishedSeconds('load', inst.weightsGib) * 1000)
    return { instance_id: id }
  }

  async unload(id: string): Promise<void> {
    const inst = this.instances.get(id)
    if (!inst || inst.lifecycle.state === 'stopping') return
    inst.lifecycle.routing = false
    this.setState(inst, 'stopping')
    this.counts.unloads++
    await this.clock.sleep(UNLOAD_SECONDS * 1000)
    this.account()
    this.instances.delete(id)
    this.setState(inst, 'removed')
  }

  /** sleep: leave routing, drain, fall asleep (SLEEP_SECONDS); it keeps ASLEEP_MIB on each GPU. */
  async sleep(id: string, level: 1 | 2) {
    const inst = this.require(id)
    if (inst.lifecycle.state !== 'active' || inst.lifecycle.operation) throw new Error(`${id} is busy`)
    inst.lifecycle.routing = false
    this.setOperation(inst, 'sleep', true)
    await inst.lifecycle.drained()
    await this.clock.sleep(SLEEP_SECONDS(level, inst.weightsGib) * 1000)
    this.account()
    const awake = inst.heldMib
    inst.heldMib = ASLEEP_MIB
    inst.sleepLevel = level
    inst.row.sleep_level = level
    this.counts.sleeps++
    this.setState(inst, 'sleeping')
    this.setOperation(inst, 'sleep', false)
    const gpus = Object.fromEntries(
      inst.gpuIds.map((g) => [String(g), { awake_gib: awake / 1024, asleep_gib: ASLEEP_MIB / 1024 }]),
    )
    this.bus.emit('gateway.instance.sleep', {
      instance_id: id,
      served_model_name: inst.model.name,
      level,
      memory_check: { gpus },
    } as never)
    return { sleep_verified: true, memory_check: { gpus } }
  }

  /** wakeEngine: joinable; refused when its GPUs lack what it takes back; vLLM's wake time for its level. */
  wakeEngine(inst: ReplayInstance): Promise<unknown> {
    if (inst.wakeP) return inst.wakeP
    if (inst.lifecycle.state !== 'sleeping') return Promise.resolve({ status: 'running' })
    const need = inst.claimMib - inst.heldMib
    for (const g of inst.gpuIds)
      if (GPU_TOTAL_MIB - this.usedMib(g) < need)
        return Promise.reject(insufficientMemory(`GPU ${g} lacks ${need} MiB for the wake`))
    this.account()
    // What it takes back is claimed at once, as the engine's allocator does.
    inst.heldMib = inst.claimMib
    const level = inst.sleepLevel ?? 1
    this.setOperation(inst, 'wake', true)
    this.counts.wakes++
    inst.wakeP = (async () => {
      await this.clock.sleep(publishedSeconds(level === 2 ? 'wake2' : 'wake1', inst.weightsGib) * 1000)
      inst.sleepLevel = null
      inst.row.sleep_level = null
      inst.lifecycle.routing = true
      this.setState(inst, 'active')
      this.setOperation(inst, 'wake', false)
      inst.wakeP = null
      return { status: 'running', instance_id: inst.id, sleep_level: null, phases: [] }
    })()
    return inst.wakeP
  }

  /** hostParkedMib: host RAM the level-1 sleepers' weights take. */
  hostParkedMib(): number {
    let n = 0
    for (const i of this.instances.values())
      if (i.lifecycle.state === 'sleeping' && i.sleepLevel === 1) n += i.weightsGib * 1024 * i.gpuIds.length
    return n
  }
}

// ---- one run ----

export type ReplayPolicy = 'cost' | 'lru' | 'lru-sleep' | 'static' | 'clairvoyant'

export interface ReplayRequest {
  at: number
  model: string
  ttft_s?: number
  error?: string
}

export interface ReplayOutcome {
  policy: ReplayPolicy
  /** Virtual epoch ms at which the trace began (after the warm start): decisions' `at` count from it. */
  startedAt: number
  served: number
  failed: number
  ttft: number[]
  failures: Map<string, number>
  requests: ReplayRequest[]
  decisions: ResidencyDecision[]
  counts: EngineCounts
  gpuMemoryGibHours: number
}

export interface ReplaySetup {
  models: readonly ReplayModel[]
  gpus: number
  /** The first `preload` models are loaded (and serve) before the trace starts. */
  preload: number
  residency: Partial<ResidencyConfig>
}

/** The residency settings a replay runs with: the shipped defaults (plugins.gateway.residency), as an operator gets them. */
export const REPLAY_RESIDENCY = Value.Default(ResidencyConfig, {}) as ResidencyConfig

/** How a request gets its model serving: the manager's way (through the directory's backends) or the bound's. */
interface Keeper {
  /** ready: resolves once an instance of `model` takes requests (or rejects with why not). */
  ready(model: string, signal: AbortSignal): Promise<void>
  held: Map<string, number>
}

export async function replay(
  policy: ReplayPolicy,
  trace: readonly TraceEvent[],
  setup: ReplaySetup,
): Promise<ReplayOutcome> {
  const clock = new VirtualClock()
  const bus = new EventBus()
  const gw = new ReplayGateway(clock, bus, setup.gpus, setup.models)
  const config: ResidencyConfig = {
    ...REPLAY_RESIDENCY,
    ...setup.residency,
    policy: policy === 'static' ? 'off' : policy === 'clairvoyant' ? 'cost' : policy,
  }
  const catalogued = policy === 'static' ? setup.models.slice(0, setup.preload) : setup.models
  const decisions: ResidencyDecision[] = []
  bus.on('gateway.residency.decision', (d) => decisions.push(d))
  const held = new Map<string, number>()
  // Every request end and every change of an instance wakes whoever waits for one.
  bus.on('proxy.request', () => gw.changed())

  const ready = (model: string) =>
    [...gw.instances.values()].some((i) => i.model.name === model && i.lifecycle.takesRequests)
  /** Virtual ms at which the trace starts (after the warm start). */
  const origin = { t: 0 }
  let keeper: Keeper
  let stop = () => {}
  if (policy === 'clairvoyant') {
    keeper = clairvoyant(gw, trace, config, held, origin)
  } else {
    const entries: CatalogEntry[] = catalogued.map(
      (m) =>
        ({
          name: m.name,
          model_path: `org/${m.name}`,
          gpu_memory_utilization: m.util,
          enable_sleep_mode: true,
          tensor_parallel_size: 1,
          gpu_ids: null,
          pin: false,
          preload: false,
        }) as unknown as CatalogEntry,
    )
    const manager = new ResidencyManager({
      // The gateway as the manager reads it: ReplayGateway has every member the manager uses.
      service: gw as unknown as GatewayService,
      catalog: { entries: () => entries, entry: (name) => entries.find((e) => e.name === name) },
      config,
      defaultUtilization: 0.9,
      bus,
      log: new Logger('error', 'residency', 'text', () => {}),
      metrics: new Registry(),
      clock,
      held: (model) => held.get(model) ?? 0,
    })
    stop = () => manager.stop()
    const source = catalogSource(manager)
    const control = {
      sleep: async () => {},
      wake: (inst: ManagedInstance) => manager.wake(inst),
      queue: (inst: ManagedInstance) => manager.queue(inst.row.served_model_name),
      abandoned: (inst: ManagedInstance) => manager.abandoned(inst.row.served_model_name),
      pinned: () => false,
    }
    // The directory's one wake run per model: every request held for it joins the one under way.
    const runs = new Map<string, Promise<void>>()
    const wakeOnce = (model: string, inst: ReplayInstance | undefined): Promise<void> => {
      let run = runs.get(model)
      if (!run) {
        const p = inst
          ? new ManagedHandle(inst as unknown as ManagedInstance, control).wake()
          : (source.backends(model)[0]?.wake?.() ?? Promise.resolve())
        run = p.finally(() => runs.delete(model))
        runs.set(model, run)
      }
      return run
    }
    keeper = {
      held,
      async ready(model, signal) {
        if (!manager.catalogued(model)) throw new Error(`${model} is not in the catalogue`)
        // A request whose model is evicted again between its wake and its turn waits again, at
        // most MAX_HOLDS times in all (src/directory/directory.ts), within its one deadline.
        for (let holds = 0; ; ) {
          if (signal.aborted) throw signal.reason
          if (ready(model)) return
          if (holds >= MAX_HOLDS) throw new Error('503 evicted again after each of its waits')
          const insts = [...gw.instances.values()].filter((i) => i.model.name === model)
          // The directory's backend for the model: its instance's handle, else its catalogue entry.
          const inst = insts.find((i) => i.lifecycle.state !== 'stopping')
          const changed = gw.nextChange()
          if (inst || insts.length === 0) {
            // A hold is a wait for a wake or a load (not for an instance leaving routing to go).
            const hold = inst?.lifecycle.state !== 'active' || inst.lifecycle.operation === 'sleep'
            await wakeOnce(model, inst)
            if (hold) holds++
          }
          // Not serving yet (leaving routing for an unload, stopping): its next change, then again.
          if (!ready(model)) await changed
        }
      },
    }
  }

  // The warm start: the first `preload` models loaded and serving, one GPU set each in order.
  for (const m of setup.models.slice(0, setup.preload)) {
    const claim = gw.claimOf(m)
    let g = 0
    while (g < setup.gpus && GPU_TOTAL_MIB - gw.usedMib(g) < claim) g++
    await gw.load({ served_model_name: m.name, gpu_ids: [g], evictable: policy !== 'static' })
  }
  await clock.run(() => [...gw.instances.values()].every((i) => i.lifecycle.takesRequests))
  gw.counts.coldLoads = 0
  const t0 = clock.t
  origin.t = t0
  gw.finish()
  gw.counts.mibMs = 0

  const out: ReplayOutcome = {
    policy,
    startedAt: clock.now(),
    served: 0,
    failed: 0,
    ttft: [],
    failures: new Map(),
    requests: [],
    decisions,
    counts: gw.counts,
    gpuMemoryGibHours: 0,
  }
  let pending = trace.length
  const fail = (e: TraceEvent, error: string) => {
    out.failed++
    out.failures.set(error, (out.failures.get(error) ?? 0) + 1)
    out.requests.push({ at: e.at, model: e.model, error })
  }
  const serve = (e: TraceEvent, arrived: number) => {
    const inst = [...gw.instances.values()].find(
      (i) => i.model.name === e.model && i.lifecycle.takesRequests,
    )!
    inst.lifecycle.acquire()
    const ttft = (clock.t - arrived) / 1000
    out.served++
    out.ttft.push(ttft)
    out.requests.push({ at: e.at, model: e.model, ttft_s: ttft })
    clock.setTimeout(() => {
      inst.lifecycle.release()
      bus.emit('proxy.request', {
        model: e.model,
        instance_id: inst.id,
        status: 200,
        duration_ms: SERVE_SECONDS * 1000,
        ttft_ms: ttft * 1000,
        streamed: true,
        path: '/v1/chat/completions',
      })
      pending--
    }, SERVE_SECONDS * 1000)
  }
  const request = async (e: TraceEvent) => {
    const arrived = clock.t
    if (ready(e.model)) return serve(e, arrived)
    const n = held.get(e.model) ?? 0
    if (n >= config.max_queue) {
      pending--
      return fail(e, '429 queue_full')
    }
    held.set(e.model, n + 1)
    const signal = clock.timeout(config.queue_timeout_seconds * 1000)
    try {
      await Promise.race([
        keeper.ready(e.model, signal),
        new Promise<never>((_, reject) =>
          signal.addEventListener('abort', () => reject(new Error('503 timed out waiting for the model')), {
            once: true,
          }),
        ),
      ])
      held.set(e.model, (held.get(e.model) ?? 1) - 1)
      // Served where it is now (a request released when its model serves takes it at once).
      if (ready(e.model)) return serve(e, arrived)
      pending--
      fail(e, 'not serving after its wait')
    } catch (err) {
      held.set(e.model, (held.get(e.model) ?? 1) - 1)
      pending--
      gw.changed()
      const msg = (err as Error).message
      fail(
        e,
        msg.startsWith('503') || msg.includes('timed out') ? '503 timed out waiting for the model' : msg,
      )
    }
  }
  for (const e of trace) clock.setTimeout(() => void request(e), t0 + e.at * 1000 - clock.t)
  await clock.run(() => pending === 0)
  gw.finish()
  stop()
  out.gpuMemoryGibHours = gw.counts.mibMs / 1024 / 3_600_000
  out.requests.sort((a, b) => a.at - b.at)
  return out
}

// ---- the bound ----

/**
 * clairvoyant: the Belady keeper. Decisions one at a time (as the manager's); a model that is
 * absent or asleep gets room on the GPU (set) where the victims' next requests are farthest away,
 * the victims chosen farthest-next-request first; an active victim sleeps at level 1 while host RAM
 * allows, else at level 2; a sleeping one is unloaded when its last ASLEEP_MIB is wanted. A model
 * with a request in flight, queued, or an operation under way is never a victim.
 */
function clairvoyant(
  gw: ReplayGateway,
  trace: readonly TraceEvent[],
  config: ResidencyConfig,
  held: Map<string, number>,
  origin: { t: number },
): Keeper {
  const clock = gw.clock
  const times = new Map<string, number[]>()
  for (const e of trace) {
    const list = times.get(e.model) ?? []
    list.push(e.at * 1000)
    times.set(e.model, list)
  }
  /** nextUse: ms from now to the model's next request after now (Infinity: never again). */
  const nextUse = (model: string): number => {
    const list = times.get(model) ?? []
    const now = clock.t - origin.t
    let lo = 0
    let hi = list.length
    while (lo < hi) {
      const mid = (lo + hi) >> 1
      if (list[mid]! <= now) lo = mid + 1
      else hi = mid
    }
    return lo < list.length ? list[lo]! - now : Number.POSITIVE_INFINITY
  }
  let chain: Promise<unknown> = Promise.resolve()
  const budget = config.host_memory_budget_gib * 1024
  const reserved = new Map<number, number>()
  /** Victims chosen and not yet out of the way: no second decision counts them. */
  const evicting = new Set<string>()

  type Step = { inst: ReplayInstance; action: 'sleep1' | 'sleep2' | 'unload'; frees: number }
  /** victims on `gpu` freeing `short` MiB there, farthest next request first (null: cannot). */
  const victimsOn = (
    gpu: number,
    short: number,
    model: string,
  ): { steps: Step[]; soonest: number } | null => {
    const cands = [...gw.instances.values()].filter(
      (i) =>
        i.gpuIds.includes(gpu) &&
        i.model.name !== model &&
        !evicting.has(i.id) &&
        i.lifecycle.operation === null &&
        i.lifecycle.inFlight === 0 &&
        (held.get(i.model.name) ?? 0) === 0 &&
        (i.lifecycle.state === 'active' || i.lifecycle.state === 'sleeping'),
    )
    cands.sort((a, b) => nextUse(b.model.name) - nextUse(a.model.name) || a.id.localeCompare(b.id))
    const steps: Step[] = []
    let host = budget - gw.hostParkedMib()
    let left = short
    let soonest = Number.POSITIVE_INFINITY
    for (const i of cands.filter((c) => c.lifecycle.state === 'active')) {
      if (left <= 0) break
      const parked = i.weightsGib * 1024
      const level1 = parked <= host
      if (level1) host -= parked
      steps.push({ inst: i, action: level1 ? 'sleep1' : 'sleep2', frees: i.heldMib - ASLEEP_MIB })
      left -= i.heldMib - ASLEEP_MIB
      soonest = Math.min(soonest, nextUse(i.model.name))
    }
    // Then the last ASLEEP_MIB of sleepers (the ones asleep now first, then those just put to sleep).
    const sleepers = [...cands.filter((c) => c.lifecycle.state === 'sleeping'), ...steps.map((s) => s.inst)]
    for (const i of sleepers) {
      if (left <= 0) break
      const step = steps.find((s) => s.inst === i)
      if (step) step.action = 'unload'
      else steps.push({ inst: i, action: 'unload', frees: ASLEEP_MIB })
      left -= ASLEEP_MIB
      soonest = Math.min(soonest, nextUse(i.model.name))
    }
    return left <= 0 ? { steps, soonest } : null
  }

  const makeRoom = async (model: string, want: { gpuChoices: number[][]; needMib: number }) => {
    for (;;) {
      const turn = chain.then(() => {
        let best: { set: number[]; steps: Step[]; soonest: number } | null = null
        for (const set of want.gpuChoices) {
          const steps: Step[] = []
          let soonest = Number.POSITIVE_INFINITY
          let ok = true
          for (const g of set) {
            const free = GPU_TOTAL_MIB - gw.usedMib(g) - (reserved.get(g) ?? 0)
            if (free >= want.needMib) continue
            const v = victimsOn(g, want.needMib - free, model)
            if (!v) {
              ok = false
              break
            }
            steps.push(...v.steps)
            soonest = Math.min(soonest, v.soonest)
          }
          if (!ok) continue
          if (
            !best ||
            soonest > best.soonest ||
            (soonest === best.soonest && steps.length < best.steps.length)
          )
            best = { set, steps, soonest }
        }
        if (best) for (const g of best.set) reserved.set(g, (reserved.get(g) ?? 0) + want.needMib)
        for (const s of best?.steps ?? []) evicting.add(s.inst.id)
        return best
      })
      chain = turn.catch(() => {})
      const best = await turn
      if (!best) {
        await gw.nextChange()
        continue
      }
      try {
        await Promise.all(
          best.steps.map(async (s) => {
            if (s.action === 'unload') {
              if (s.inst.lifecycle.state === 'active') {
                s.inst.lifecycle.route(false)
                await s.inst.lifecycle.drained()
              }
              await gw.unload(s.inst.id)
            } else await gw.sleep(s.inst.id, s.action === 'sleep1' ? 1 : 2)
          }),
        ).finally(() => {
          for (const s of best.steps) evicting.delete(s.inst.id)
        })
      } catch {
        for (const g of best.set) reserved.set(g, Math.max(0, (reserved.get(g) ?? 0) - want.needMib))
        await gw.nextChange()
        continue
      }
      return {
        set: best.set,
        release: () => {
          for (const g of best.set) reserved.set(g, Math.max(0, (reserved.get(g) ?? 0) - want.needMib))
        },
      }
    }
  }

  const bringing = new Map<string, Promise<void>>()
  const bringUp = async (model: string) => {
    for (;;) {
      const insts = [...gw.instances.values()].filter((i) => i.model.name === model)
      if (insts.some((i) => i.lifecycle.takesRequests)) return
      const starting = insts.find((i) => i.lifecycle.state === 'starting')
      const busy = insts.find((i) => i.lifecycle.operation !== null || i.lifecycle.state === 'stopping')
      if (starting || busy) {
        await gw.nextChange()
        continue
      }
      const sleeping = insts.find((i) => i.lifecycle.state === 'sleeping')
      if (sleeping) {
        const room = await makeRoom(model, {
          gpuChoices: [sleeping.gpuIds],
          needMib: sleeping.claimMib - sleeping.heldMib,
        })
        try {
          if (sleeping.lifecycle.state === 'sleeping') await gw.wakeEngine(sleeping)
        } catch {
        } finally {
          room.release()
        }
        continue
      }
      const m = gw.models.find((x) => x.name === model)!
      const room = await makeRoom(model, {
        gpuChoices: Array.from({ length: gw.gpus }, (_, g) => [g]),
        needMib: gw.claimOf(m),
      })
      try {
        await gw.load({ served_model_name: model, gpu_ids: room.set })
      } catch {
      } finally {
        room.release()
      }
    }
  }
  return {
    held,
    ready(model, _signal) {
      let p = bringing.get(model)
      if (!p) {
        p = bringUp(model).finally(() => bringing.delete(model))
        bringing.set(model, p)
      }
      return p
    },
  }
}

// ---- figures ----

export const pct = (xs: number[], p: number) => {
  if (xs.length === 0) return Number.NaN
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor(p * s.length))]!
}
