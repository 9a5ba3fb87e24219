import type { Registry } from 'prom-client'
import { DEFAULT_ENGINE_KIND } from '../../../src/engine/kinds.ts'
import { gpuMemoryMib } from '../../../src/gpu/memory.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import type { SpanBase } from '../../../src/host/telemetry/spans.ts'
import { AppError, conflict } from '../../../src/http/errors.ts'
import type { CatalogEntry, InstanceRecord, SleepOptions, SleepResult, WakeResult } from '../api.ts'
import { catalogLoadRequest } from '../catalog/rules.ts'
import type { ManagedInstance } from '../instance.ts'
import type { GatewayService } from '../service.ts'
import { REAL_CLOCK, type ResidencyClock } from './clock.ts'
import type { ResidencyConfig } from './config.ts'
import { bringBack, type EvictAction, type Measured, RequestRate } from './costs.ts'
import type { ResidencyHooks } from './hooks.ts'
import { ResidencyMetrics } from './metrics.ts'
import { type Plan, plan, type Resident, type Victim } from './planner.ts'

/**
 * ResidencyManager is the one owner of what is resident in this host's GPU memory: it serves any
 * catalogued model on demand and makes room for a load or a wake by putting to sleep or unloading
 * what costs least to bring back (planner.ts), never a model with a request in flight or queued,
 * pinned, loaded by hand, or resident for less than min_resident_seconds. Mechanisms stay the
 * gateway's (load, sleep with its drain and check, wake, unload); this module only decides when.
 *
 * - bringUp(name): the model's one way to become resident (joined by every request that waits for
 *   it): wake its sleeping instance, wait for its loading one, or load it from the catalogue.
 * - roomFor: one decision at a time (a chain), so two loads never count the same free memory; what
 *   a decided load or wake will take is reserved on its GPUs until the engine holds it. When nothing
 *   can be freed now (every candidate busy or too young), the decision waits for the next change
 *   (an instance idle, gone, asleep; the youngest reaching min_resident_seconds) up to the caller's
 *   deadline: two models that cannot both fit are served one after the other, never ping-ponged.
 * - A victim leaves routing at once and is drained (nothing routed to it meanwhile: requests for it
 *   queue and bring it back); a sleep that frees less than it should is escalated to an unload.
 */
/** CatalogReader: where the manager reads the catalogue (plugins/gateway/catalog). */
export interface CatalogReader {
  entries(): readonly CatalogEntry[]
  entry(name: string): CatalogEntry | undefined
}

export interface ResidencyDeps {
  service: GatewayService
  catalog: CatalogReader
  config: ResidencyConfig
  /** The gateway's default gpu_memory_utilization (a load's claim when the entry gives none). */
  defaultUtilization: number
  /** The gateway's engine.kind (the engine of a load that names none). */
  defaultEngineKind?: string
  bus: EventBus
  log: Logger
  metrics: Registry
  /** Epoch ms (request times); performance.now() measures durations. */
  now?: () => number
  /** The manager's time and timers (REAL_CLOCK unless given: the replay's is virtual). */
  clock?: ResidencyClock
  /** held: requests queued for a model now (the model directory's count). */
  held(model: string): number
}

export interface ResidencyDecision {
  at: string
  /** kind `idle`: the idle rule (the router's auto-sleep), which frees nothing for anyone in particular. */
  trigger: { model: string; need_gib: number; gpu_ids: number[]; kind: 'load' | 'wake' | 'idle' }
  victims: {
    model: string
    instance_id: string
    action: EvictAction
    freed_gib: number
    expected_cost_s: number
  }[]
  rejected: { model: string; instance_id: string; action: EvictAction | null; reason: string }[]
  reason: string
}

/** Decisions kept for GET /api/residency. */
const KEEP_DECISIONS = 50
/** GPU memory a sleeping engine keeps (its CUDA context) when its sleep was never measured. */
const DEFAULT_AFTER_SLEEP_MIB = 1024
/** A decision that could not be carried out is retried at least this often while someone waits. */
const RETRY_MS = 1000

const MiB = 1024

export class ResidencyManager implements ResidencyHooks {
  private readonly rates = new Map<string, RequestRate>()
  private readonly measured = new Map<string, Measured>()
  /** When each instance became resident (active), epoch ms: min_resident_seconds counts from it. */
  private readonly residentSince = new Map<string, number>()
  /** What a model's engine kept on each GPU after its last measured sleep (MiB): what a sleep leaves. */
  private readonly afterSleep = new Map<string, number>()
  /** Memory decided loads and wakes will still take, per GPU (MiB). */
  private readonly reserved = new Map<number, number>()
  /** Instances chosen as victims and not yet out of the way: no second decision counts them. */
  private readonly evicting = new Set<string>()
  /** The one bring-up of each model under way. */
  private readonly bringing = new Map<string, Promise<void>>()
  /** Models a request (not an operator) is loading, cancelled when every waiter leaves. */
  private readonly onDemand = new Set<string>()
  private readonly decisions: ResidencyDecision[] = []
  /** One decision at a time. */
  private chain: Promise<unknown> = Promise.resolve()
  private readonly changed = new Set<() => void>()
  private readonly metrics: ResidencyMetrics
  private readonly now: () => number
  private readonly timers = new Set<unknown>()
  readonly clock: ResidencyClock
  private stopped = false

  constructor(private readonly d: ResidencyDeps) {
    this.clock = d.clock ?? REAL_CLOCK
    this.now = d.now ?? (() => this.clock.now())
    this.metrics = new ResidencyMetrics(d.metrics, d.bus)
    const loadStarted = new Map<string, number>()
    const wakeStarted = new Map<string, { at: number; level: 1 | 2 | null }>()
    d.bus.on('proxy.request', (e) => this.arrived(e.served ?? e.model))
    // A load's spawn is announced as the status `null → starting`, never as a lifecycle change (a
    // lifecycle starts in that state): its time, on the lifecycle's clock (performance.now()).
    d.bus.on('gateway.instance.status', (e) => {
      if (e.previousStatus === null && e.currentStatus === 'starting')
        loadStarted.set(e.instance.id, this.clock.mono())
    })
    d.bus.on('gateway.instance.lifecycle', (e) => {
      const c = e.change
      const id = e.instance_id
      if (c.kind === 'state') {
        if (c.previous === 'starting') {
          const t0 = loadStarted.get(id)
          loadStarted.delete(id)
          if (t0 !== undefined && c.current === 'active')
            this.measure(e.served_model_name, this.kindOf(e.served_model_name, id), 'load', e.at - t0)
        }
        if (c.current === 'active') {
          this.residentSince.set(id, this.now())
          const w = wakeStarted.get(id)
          if (w && c.previous === 'sleeping')
            this.measure(
              e.served_model_name,
              this.kindOf(e.served_model_name, id),
              w.level === 2 ? 'wake2' : 'wake1',
              e.at - w.at,
            )
        }
        if (c.current === 'sleeping' || c.current === 'removed' || c.current === 'failed') {
          this.residentSince.delete(id)
          this.evicting.delete(id)
        }
        if (c.current === 'removed') {
          loadStarted.delete(id)
          wakeStarted.delete(id)
        }
      } else if (c.kind === 'operation' && c.operation === 'wake' && c.running) {
        const level = d.service.get(id)?.sleep_level
        wakeStarted.set(id, { at: e.at, level: level === 1 || level === 2 ? level : null })
      }
      this.notify()
    })
    d.bus.on('proxy.request', () => this.notify())
    d.bus.on('gateway.instance.sleep', (e) => {
      const kept = Object.values(e.memory_check.gpus).map((g) => g.asleep_gib)
      if (kept.length) this.afterSleep.set(e.served_model_name, Math.max(...kept) * MiB)
    })
  }

  /**
   * active: the manager runs when the catalogue has entries; without one nothing is loaded, woken
   * with room made or evicted on its own, as before the catalogue existed.
   */
  get active(): boolean {
    return this.d.catalog.entries().length > 0
  }

  /** catalogued: the catalogue entry a served name is, if any. */
  catalogued(name: string): CatalogEntry | undefined {
    return this.d.catalog.entry(name)
  }

  /** queue: how requests for a catalogued model wait for it (null: not catalogued). */
  queue(name: string): { max: number; timeoutMs: number } | null {
    if (!this.catalogued(name)) return null
    return { max: this.d.config.max_queue, timeoutMs: this.d.config.queue_timeout_seconds * 1000 }
  }

  /**
   * start loads the entries marked `preload`, one after the other in catalogue order (each with room
   * made as a request's would be); a failure is logged and the next goes on. Never rejects.
   */
  async start(): Promise<void> {
    for (const e of this.d.catalog.entries()) {
      if (this.stopped) return
      if (!e.preload || this.instancesOf(e.name).length > 0) continue
      try {
        await this.bringUp(e.name, this.clock.timeout(this.d.config.queue_timeout_seconds * 1000), false)
      } catch (err) {
        if (this.stopped) return
        this.d.log.warn('preload failed', { model: e.name, error: (err as Error).message })
      }
    }
  }

  stop(): void {
    this.stopped = true
    for (const t of this.timers) this.clock.clearTimeout(t)
    this.timers.clear()
    this.notify()
  }

  // ---- bringing a model up ----

  /**
   * bringUp: the model serves (an instance of it active), whatever it takes: its one bring-up,
   * joined by every request for it. `onDemand`: a request asked (it is cancelled when every waiter
   * leaves); an operator's or the preload's is not.
   */
  bringUp(name: string, signal: AbortSignal, onDemand = true, trace: SpanBase | null = null): Promise<void> {
    const under = this.bringing.get(name)
    if (under) return under
    if (onDemand) this.onDemand.add(name)
    // The first request's span is the parent of the load's or wake's (the others join it).
    const p: Promise<void> = this.doBringUp(name, signal, trace).finally(() => {
      // A cancelled bring-up was let go already (abandoned): the next one may be under way.
      if (this.bringing.get(name) !== p) return
      this.bringing.delete(name)
      this.onDemand.delete(name)
    })
    this.bringing.set(name, p)
    return p
  }

  /**
   * abandoned: every request waiting for `name` left; a load only they asked for is cancelled, and
   * its bring-up let go at once (true): the next request for the model starts a new one instead of
   * joining the one that ends cancelled.
   */
  abandoned(name: string): boolean {
    if (!this.onDemand.has(name)) return false
    let cancelled = false
    for (const i of this.instancesOf(name)) {
      if (i.status !== 'starting') continue
      this.d.log.info('cancelling a load nothing waits for any more', { model: name, instance: i.id })
      this.metrics.action(name, 'cancel', 'abandoned')
      void this.d.service.unload(i.id).catch(() => {})
      cancelled = true
    }
    if (cancelled) {
      this.bringing.delete(name)
      this.onDemand.delete(name)
    }
    return cancelled
  }

  private async doBringUp(name: string, signal: AbortSignal, trace: SpanBase | null): Promise<void> {
    for (;;) {
      if (signal.aborted) throw signal.reason
      const insts = this.instancesOf(name)
      const active = insts.find((i) => i.status === 'active')
      if (active) return
      const starting = insts.find((i) => i.status === 'starting')
      if (starting) {
        await this.d.service.waitFor(starting.id, (s) => s !== 'starting', {
          signal,
          what: `the load of ${name}`,
        })
        if (this.d.service.get(starting.id)?.status === 'active') return
        throw this.loadEnded(name, starting.id)
      }
      const sleeping = insts.find((i) => i.status === 'sleeping')
      if (sleeping) {
        const woke = await this.wake(this.d.service.require(sleeping.id), signal, trace)
        if (woke.status === 'sleeping') throw new Error('the engine still reports sleeping after waking up')
        return
      }
      const entry = this.catalogued(name)
      if (!entry) throw new Error(`${name} is not in the catalogue`)
      // A failed instance of it holds nothing: it goes, and the model loads again.
      for (const f of insts.filter((x) => x.status === 'failed'))
        await this.d.service.unload(f.id).catch(() => {})
      await this.load(entry, signal, trace)
    }
  }

  /** load: room on some GPUs for the entry, then the gateway's own load there. */
  private async load(entry: CatalogEntry, signal: AbortSignal, trace: SpanBase | null): Promise<void> {
    const tp = entry.tensor_parallel_size
    const util = entry.gpu_memory_utilization ?? this.d.defaultUtilization
    const fixed = entry.gpu_ids ?? undefined
    const started = await this.withRoom(
      {
        model: entry.name,
        kind: 'load',
        choices: (gpus) => this.choices(gpus, tp, fixed),
        needFraction: util,
        needed: () => !this.hasInstance(entry.name),
      },
      signal,
      async (gpuIds) => {
        this.metrics.coldStart(entry.name)
        // On the GPUs room was made on; evictable unless pinned (a hand-loaded instance never is).
        const req = {
          ...catalogLoadRequest(entry.name, entry),
          gpu_ids: gpuIds,
          evictable: !entry.pin,
          force: true,
        }
        return (await this.d.service.load(req, { trace })).instance_id
      },
    )
    // Another load of it got there first: the bring-up's loop waits for that one.
    if (started === null) return
    await this.d.service.waitFor(started, (s) => s !== 'starting', {
      signal,
      what: `the load of ${entry.name}`,
    })
    if (this.d.service.get(started)?.status !== 'active') throw this.loadEnded(entry.name, started)
  }

  /** loadEnded: a load that ended without serving, as its waiters are told (a failure with its reason). */
  private loadEnded(name: string, id: string): Error {
    const inst = this.d.service.get(id)
    if (inst?.status === 'failed')
      return new Error(`the load of ${name} failed: ${inst.error ?? 'no reason given'}`)
    return new Error(`the load of ${name} ended ${inst?.status ?? 'removed'}`)
  }

  /**
   * wake: the instance's wake, with room made first when its GPUs lack what it frees when it
   * sleeps. The gateway's wake is joinable, so a request, an operator and the router share it.
   */
  async wake(
    inst: ManagedInstance,
    signal?: AbortSignal,
    trace: SpanBase | null = null,
  ): Promise<WakeResult> {
    const rec = inst.record()
    const need = this.wakeNeedMib(rec)
    // A wake already under way is joined as it is (its room was made when it began).
    if (this.d.config.policy === 'off' || need === 0 || inst.lifecycle.operation === 'wake')
      return this.d.service.wakeEngine(inst, trace)
    let result: WakeResult | null = null
    await this.withRoom(
      {
        model: rec.served_model_name,
        kind: 'wake',
        choices: () => [rec.gpu_ids],
        needMib: need,
        // Woken meanwhile (another caller's wake), or gone: nothing to make room for.
        needed: () => inst.lifecycle.state === 'sleeping' && inst.lifecycle.operation !== 'wake',
      },
      signal ?? this.clock.timeout(this.d.config.queue_timeout_seconds * 1000),
      async () => {
        // Woken by someone else while room was made (an operator's wake joins none of this one's):
        // the instance serves, which is all the caller asked for.
        if (inst.lifecycle.state === 'sleeping') result = await this.d.service.wakeEngine(inst, trace)
        return inst.id
      },
    )
    // A wake under way meanwhile is joined; one already done answers the instance as it is now.
    if (result) return result
    if (inst.lifecycle.state === 'sleeping') return this.d.service.wakeEngine(inst, trace)
    return {
      status: 'running',
      instance_id: inst.id,
      model_path: inst.row.model_path,
      woke_at: new Date(this.now()).toISOString(),
      sleep_level: null,
      phases: [],
    }
  }

  // ---- the idle rule ----

  /**
   * sleepIdle: the router's auto-sleep of an idle instance, as a rule of this manager: a pinned
   * model is refused (409 PINNED), an instance already chosen as a victim is left to that decision
   * (409), and the sleep (the gateway's: drain, sleep, check) is recorded as a decision with reason
   * `idle`, counted in modelgate_residency_actions_total{reason="idle"}. Unlike an eviction it is
   * not escalated to an unload when it frees too little: nobody waits for that memory, and the
   * gateway's own sleep.verify_fallback applies.
   */
  async sleepIdle(inst: ManagedInstance, level: 1 | 2, opts: SleepOptions): Promise<SleepResult> {
    const r = inst.row
    if (this.pinned(r.served_model_name))
      throw conflict(`${r.served_model_name} is pinned: the residency manager keeps it resident`, 'PINNED')
    if (this.evicting.has(r.id)) throw conflict(`${r.served_model_name} is already being evicted`, 'BUSY')
    const action: EvictAction = level === 1 ? 'sleep1' : 'sleep2'
    const idleSince = this.lastRequestAt(r.served_model_name) ?? this.residentSince.get(r.id) ?? null
    const weightsGib = inst.record().memory_metrics?.weights_memory_gib ?? null
    this.evicting.add(r.id)
    try {
      const result = await this.d.service.sleepEngine(inst, level, opts)
      const freed = Object.values(result.memory_check.gpus).reduce(
        (n, g) => n + Math.max(0, g.awake_gib - g.asleep_gib),
        0,
      )
      const costs = this.costs(r.served_model_name, weightsGib)
      this.metrics.action(r.served_model_name, action, 'idle')
      this.record({
        at: new Date(this.now()).toISOString(),
        trigger: { model: r.served_model_name, need_gib: 0, gpu_ids: r.gpu_ids, kind: 'idle' },
        victims: [
          {
            model: r.served_model_name,
            instance_id: r.id,
            action,
            freed_gib: Math.round(freed * 100) / 100,
            expected_cost_s: level === 1 ? costs.wake_l1_s : costs.wake_l2_s,
          },
        ],
        rejected: [],
        reason:
          idleSince === null
            ? 'idle since it was loaded'
            : `idle for ${Math.round((this.now() - idleSince) / 1000)} s`,
      })
      return result
    } finally {
      this.evicting.delete(r.id)
    }
  }

  /** pinned: whether `name` is a pinned catalogue entry. */
  pinned(name: string): boolean {
    return this.catalogued(name)?.pin === true
  }

  // ---- making room ----

  /**
   * withRoom: one decision at a time: plan room for `want` on the GPUs as they are now (less what
   * is reserved), carry out its evictions, reserve what it will take, run `act`, and release the
   * reservation once `act` has started it (a started engine's claim is the gateway's from then on).
   * When it cannot fit now it waits for the next change and plans again, until `signal`.
   */
  private async withRoom(
    want: {
      model: string
      kind: 'load' | 'wake'
      choices: (gpus: number[]) => number[][]
      needMib?: number
      needFraction?: number
      /** needed: whether it is still to be done (another wake or load may have done it meanwhile). */
      needed: () => boolean
    },
    signal: AbortSignal,
    act: (gpuIds: number[]) => Promise<string>,
  ): Promise<string | null> {
    for (;;) {
      if (signal.aborted) throw signal.reason
      if (this.stopped) throw conflict('The server is stopping', 'STOPPING')
      const turn = this.chain.then(async () => {
        if (!want.needed()) return { done: true } as const
        const decided = await this.decide(want)
        if (!decided.fits) return { wait: decided.reason } as const
        for (const g of decided.gpuIds) this.reserved.set(g, (this.reserved.get(g) ?? 0) + decided.needMib)
        return { decided } as const
      })
      this.chain = turn.catch(() => {})
      const outcome = await turn
      if ('done' in outcome) return null
      if ('wait' in outcome) {
        if (this.d.config.policy === 'off')
          throw conflict(`${want.model} does not fit: ${outcome.wait}`, 'INSUFFICIENT_MEMORY')
        await this.nextChange(signal)
        continue
      }
      const { decided } = outcome
      try {
        await this.evict(decided.victims)
        return await act(decided.gpuIds)
      } catch (err) {
        // The gateway's own check at the start measured the GPUs fuller than the plan did (a
        // victim's memory not yet given back, another engine's claim landing in between): not a
        // failure of the request, whose deadline still holds; the next change brings a new plan.
        if (!isInsufficientMemory(err) || signal.aborted) throw err
        this.d.log.info('residency: the GPUs were fuller than planned; planning again', {
          model: want.model,
          kind: want.kind,
          gpu_ids: decided.gpuIds,
          reason: (err as Error).message,
        })
      } finally {
        for (const g of decided.gpuIds)
          this.reserved.set(g, Math.max(0, (this.reserved.get(g) ?? 0) - decided.needMib))
      }
      await this.nextChange(signal)
    }
  }

  /** decide: the plan for `want` now, recorded with its reasons. */
  private async decide(want: {
    model: string
    kind: 'load' | 'wake'
    choices: (gpus: number[]) => number[][]
    needMib?: number
    needFraction?: number
  }): Promise<
    { fits: true; gpuIds: number[]; victims: Victim[]; needMib: number } | { fits: false; reason: string }
  > {
    const snapshot = await this.d.service.gpuSnapshot()
    if (!snapshot.available)
      return { fits: true, gpuIds: want.choices([0])[0] ?? [0], victims: [], needMib: 0 }
    const pending = this.d.service.pendingMibByGpu(snapshot)
    const gpus = snapshot.gpus.map((g) => {
      const m = gpuMemoryMib(g)
      return {
        index: g.index,
        totalMib: m.total ?? 0,
        freeMib: Math.max(0, (m.free ?? 0) - (pending.get(g.index) ?? 0) - (this.reserved.get(g.index) ?? 0)),
      }
    })
    const totals = new Map(gpus.map((g) => [g.index, g.totalMib]))
    const choices = want.choices(gpus.map((g) => g.index))
    // A load claims gpu_memory_utilization × its device; GPUs of one host are taken as alike here.
    const needMib =
      want.needMib ?? Math.ceil((want.needFraction ?? 0.9) * (totals.get(choices[0]?.[0] ?? 0) ?? 0))
    const p: Plan = plan({
      policy: this.d.config.policy === 'off' ? 'lru' : this.d.config.policy,
      gpus,
      residents: this.d.config.policy === 'off' ? [] : this.residents(),
      need: { model: want.model, gpuChoices: choices, needMib },
      hostBudgetMib: this.d.config.host_memory_budget_gib * 1024,
      hostUsedMib: this.hostUsedMib(),
      horizonSeconds: this.d.config.horizon_seconds,
    })
    if (!p.fits) return { fits: false, reason: p.reason }
    if (p.victims.length > 0) {
      for (const v of p.victims) this.evicting.add(v.instanceId)
      this.record({
        at: new Date(this.now()).toISOString(),
        trigger: { model: want.model, need_gib: round(needMib / MiB), gpu_ids: p.gpuIds, kind: want.kind },
        victims: p.victims.map((v) => ({
          model: v.model,
          instance_id: v.instanceId,
          action: v.action,
          freed_gib: round(v.freedMib / MiB),
          expected_cost_s: round(v.expectedCostS),
        })),
        rejected: p.rejected.map((r) => ({
          model: r.model,
          instance_id: r.instanceId,
          action: r.action,
          reason: r.reason,
        })),
        reason: `${want.kind} of ${want.model} needs ${round(needMib / MiB)} GiB on GPU ${p.gpuIds.join(', ')}`,
      })
    }
    return { fits: true, gpuIds: p.gpuIds, victims: p.victims, needMib }
  }

  /**
   * evict carries out a decision's victims: each leaves routing at once and is drained, then sleeps
   * (a sleep that frees too little is escalated to an unload) or is unloaded.
   */
  private async evict(victims: Victim[]): Promise<void> {
    await Promise.all(
      victims.map(async (v) => {
        const svc = this.d.service
        try {
          if (v.action === 'unload') {
            const inst = svc.instances.get(v.instanceId)
            if (!inst) return
            if (inst.lifecycle.state === 'active' && inst.lifecycle.routing) inst.lifecycle.route(false)
            await inst.lifecycle.drained({ timeoutMs: 30_000 }).catch(() => {})
            await svc.unload(v.instanceId)
            await svc.waitFor(v.instanceId, (s) => s === 'removed', { timeoutMs: svc.stopBudgetMs() })
            this.metrics.action(v.model, 'unload', 'memory')
            return
          }
          const level = v.action === 'sleep1' ? 1 : 2
          const result = await svc.sleep(v.instanceId, level)
          this.metrics.action(v.model, v.action, 'memory')
          if (result.sleep_verified === false && svc.get(v.instanceId)?.status === 'sleeping') {
            this.d.log.warn('a sleep freed too little: unloading the instance', { instance: v.instanceId })
            await svc.unload(v.instanceId)
            await svc.waitFor(v.instanceId, (s) => s === 'removed', { timeoutMs: svc.stopBudgetMs() })
            this.metrics.action(v.model, 'unload', 'sleep_unverified')
          }
        } finally {
          this.evicting.delete(v.instanceId)
        }
      }),
    )
  }

  /** nextChange: resolves at the next lifecycle change or request end, or at the next retry. */
  private nextChange(signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        this.changed.delete(done)
        this.clock.clearTimeout(t)
        this.timers.delete(t)
        signal.removeEventListener('abort', done)
        resolve()
      }
      const t = this.clock.setTimeout(done, this.untilSomeoneEvictable() ?? RETRY_MS)
      this.timers.add(t)
      this.changed.add(done)
      signal.addEventListener('abort', done, { once: true })
    })
  }

  private notify(): void {
    for (const f of [...this.changed]) f()
  }

  /** untilSomeoneEvictable: ms until the youngest resident reaches min_resident_seconds (null: none waits). */
  private untilSomeoneEvictable(): number | null {
    const min = this.d.config.min_resident_seconds * 1000
    let soonest: number | null = null
    for (const since of this.residentSince.values()) {
      const left = since + min - this.now()
      if (left > 0 && (soonest === null || left < soonest)) soonest = left
    }
    return soonest === null ? null : Math.min(soonest + 5, RETRY_MS)
  }

  // ---- what the planner reads ----

  private residents(): Resident[] {
    const out: Resident[] = []
    for (const inst of this.d.service.instances.values()) {
      const r = inst.row
      if (r.status !== 'active' && r.status !== 'sleeping') continue
      const holdsMib = this.holdsMib(inst)
      const weightsMib = (inst.record().memory_metrics?.weights_memory_gib ?? 0) * MiB
      out.push({
        instanceId: r.id,
        model: r.served_model_name,
        gpuIds: [...r.gpu_ids],
        state: r.status === 'active' ? 'active' : 'sleeping',
        holdsMib,
        afterSleepMib:
          this.afterSleep.get(r.served_model_name) ??
          (r.sharedcache_enabled ? Math.max(0, holdsMib - weightsMib) : DEFAULT_AFTER_SLEEP_MIB),
        parkedMib: weightsMib * r.gpu_ids.length,
        sleepable: r.enable_sleep_mode,
        sleepLevels: inst.driver.capabilities.sleepLevels,
        evictable: this.whyNotEvictable(inst) === null,
        lastUsed: this.rate(r.served_model_name).last,
        ratePerSecond: this.rate(r.served_model_name).perSecond(
          this.now(),
          this.d.config.rate_window_seconds * 1000,
        ),
        bringBack: this.costs(r.served_model_name, weightsMib / MiB || null),
      })
    }
    return out
  }

  /** whyNotEvictable: null when the instance may be a victim now, else why not. */
  whyNotEvictable(inst: ManagedInstance): string | null {
    const r = inst.row
    if (this.pinned(r.served_model_name)) return 'pinned'
    if (!r.evictable) return 'loaded by hand (not evictable)'
    if (this.evicting.has(r.id)) return 'already being evicted'
    if (inst.lifecycle.operation) return `${inst.lifecycle.operation} in progress`
    if (inst.lifecycle.inFlight > 0) return `${inst.lifecycle.inFlight} request(s) in flight`
    if (this.d.held(r.served_model_name) > 0) return 'requests queued for it'
    const since = this.residentSince.get(r.id)
    const min = this.d.config.min_resident_seconds * 1000
    if (r.status === 'active' && since !== undefined && this.now() - since < min)
      return `resident for ${Math.round((this.now() - since) / 1000)} s of the ${this.d.config.min_resident_seconds} s it keeps`
    return null
  }

  /** holdsMib: what the instance holds on the fullest of its GPUs now (ManagedInstance.holdsGibByGpu). */
  private holdsMib(inst: ManagedInstance): number {
    const holds = inst.holdsGibByGpu()
    return holds && Object.keys(holds).length ? Math.max(0, ...Object.values(holds)) * MiB : 0
  }

  /** wakeNeedMib: what a sleeping instance takes back on each of its GPUs when it wakes. */
  private wakeNeedMib(rec: InstanceRecord): number {
    const base = rec.memory_baseline_by_gpu
    const full =
      base && Object.keys(base).length
        ? Math.max(...Object.values(base))
        : (rec.memory_metrics?.total_gpu_memory_gib ?? 0)
    return Math.max(0, full * MiB - (this.afterSleep.get(rec.served_model_name) ?? DEFAULT_AFTER_SLEEP_MIB))
  }

  private hostUsedMib(): number {
    let n = 0
    for (const inst of this.d.service.instances.values()) {
      const r = inst.row
      if (r.status === 'sleeping' && r.sleep_level === 1)
        n += (inst.record().memory_metrics?.weights_memory_gib ?? 0) * MiB * r.gpu_ids.length
    }
    return n
  }

  /** choices: the GPU sets a load may go on: the entry's own, else every set of `tp` GPUs (in order). */
  private choices(gpus: number[], tp: number, fixed?: number[]): number[][] {
    if (fixed) return [fixed]
    if (tp === 1) return gpus.map((g) => [g])
    const out: number[][] = []
    const pick = (start: number, acc: number[]) => {
      if (acc.length === tp) {
        out.push([...acc])
        return
      }
      for (let i = start; i < gpus.length; i++) pick(i + 1, [...acc, gpus[i]!])
    }
    pick(0, [])
    return out
  }

  // ---- what it has learned ----

  private arrived(model: string): void {
    this.rate(model).arrived(this.now())
  }

  /** queued: a request for `model` arrived and waits (it counts toward the model's rate). */
  queued(model: string): void {
    this.arrived(model)
  }

  private rate(model: string): RequestRate {
    let r = this.rates.get(model)
    if (!r) {
      r = new RequestRate()
      this.rates.set(model, r)
    }
    return r
  }

  /** measure: what a load or wake of `model` took on an engine of `kind` (each engine its own figures). */
  private measure(model: string, kind: string, what: keyof Measured, ms: number): void {
    const key = `${kind}\u0000${model}`
    const m = this.measured.get(key) ?? { wake1: null, wake2: null, load: null }
    m[what] = ms / 1000
    this.measured.set(key, m)
  }

  /**
   * kindOf: the engine `model` runs on: its instance's (`instanceId`, else any of the model's), else
   * its catalogue entry's, else the gateway's default.
   */
  private kindOf(model: string, instanceId?: string): string {
    const inst =
      (instanceId ? this.d.service.instances.get(instanceId) : undefined) ??
      [...this.d.service.instances.values()].find((i) => i.row.served_model_name === model)
    return (
      inst?.row.engine_kind ??
      this.catalogued(model)?.engine_kind ??
      this.d.defaultEngineKind ??
      DEFAULT_ENGINE_KIND
    )
  }

  /** costs: the time to bring `model` back after each action, on the engine it runs on (kindOf). */
  costs(model: string, weightsGib: number | null) {
    const kind = this.kindOf(model)
    return bringBack(
      this.measured.get(`${kind}\u0000${model}`) ?? { wake1: null, wake2: null, load: null },
      weightsGib,
      kind,
    )
  }

  private record(d: ResidencyDecision): void {
    this.decisions.unshift(d)
    if (this.decisions.length > KEEP_DECISIONS) this.decisions.length = KEEP_DECISIONS
    this.d.bus.emit('gateway.residency.decision', d)
    this.d.log.info('residency decision', {
      trigger: `${d.trigger.kind} ${d.trigger.model}`,
      victims: d.victims.map((v) => `${v.model}:${v.action}`).join(', '),
    })
  }

  // ---- views ----

  /**
   * hasInstance: an instance of `name` here that serves, sleeps or loads (cheap: no records are
   * built). A failed or stopping one does not count: a request may load the model again.
   */
  hasInstance(name: string): boolean {
    for (const inst of this.d.service.instances.values()) {
      const s = inst.row.status
      if (inst.row.served_model_name === name && s !== 'failed' && s !== 'stopping') return true
    }
    return false
  }

  instancesOf(name: string): InstanceRecord[] {
    return this.d.service.list().filter((i) => i.served_model_name === name)
  }

  recentDecisions(): readonly ResidencyDecision[] {
    return this.decisions
  }

  /** rateOf / lastRequestAt: a model's recent request rate (per minute) and last request (epoch ms). */
  rateOf(model: string): number {
    return this.rate(model).perSecond(this.now(), this.d.config.rate_window_seconds * 1000) * 60
  }

  lastRequestAt(model: string): number | null {
    return this.rates.get(model)?.last ?? null
  }

  hostMemoryUsedGib(): number {
    return this.hostUsedMib() / MiB
  }

  /** view: GET /api/residency (routes.ts declares its shape). */
  view() {
    const models = this.d.catalog.entries().map((e) => {
      const insts = this.instancesOf(e.name)
      const rank = ['active', 'waking', 'sleeping', 'starting', 'stopping', 'failed']
      const i = [...insts].sort((a, b) => rank.indexOf(a.status) - rank.indexOf(b.status))[0]
      const inst = i ? this.d.service.instances.get(i.id) : undefined
      const waking = inst?.lifecycle.operation === 'wake'
      const state = !i
        ? 'absent'
        : waking
          ? 'waking'
          : i.status === 'starting'
            ? 'loading'
            : i.status === 'stopping'
              ? 'unloading'
              : i.status
      const why = inst ? this.whyNotEvictable(inst) : 'not resident'
      const footprint = inst ? this.holdsMib(inst) / MiB : null
      const last = this.lastRequestAt(e.name)
      return {
        name: e.name,
        state: state as 'absent' | 'loading' | 'active' | 'sleeping' | 'waking' | 'unloading' | 'failed',
        instance_id: i?.id ?? null,
        pinned: e.pin,
        evictable_now: why === null,
        why_not_evictable: why,
        last_request_at: last === null ? null : new Date(last).toISOString(),
        request_rate_per_min: round(this.rateOf(e.name)),
        queue_length: this.d.held(e.name),
        footprint_gib: footprint ? round(footprint) : null,
        gpu_ids: i ? [...i.gpu_ids] : [],
        costs: this.costs(e.name, i?.memory_metrics?.weights_memory_gib ?? null),
      }
    })
    return {
      policy: this.d.config.policy,
      active: this.active,
      host_memory: {
        budget_gib: this.d.config.host_memory_budget_gib,
        used_gib: round(this.hostMemoryUsedGib()),
      },
      models,
      decisions: [...this.decisions],
    }
  }
}

const round = (x: number) => Math.round(x * 100) / 100

declare module '../../../src/host/bus.ts' {
  interface BusEvents {
    'gateway.residency.decision': ResidencyDecision
  }
}

/** isInsufficientMemory: the gateway's placement refused a load or wake for want of GPU memory. */
function isInsufficientMemory(err: unknown): boolean {
  return err instanceof AppError && err.code === 'INSUFFICIENT_MEMORY'
}
