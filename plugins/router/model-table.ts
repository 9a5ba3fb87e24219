import type { Logger } from '../../src/host/logger.ts'
import type { GatewayApi, InstanceRecord } from '../gateway/api.ts'
import { type Backend, EndpointBackend, GatewayBackend } from './backends.ts'
import type { RouterConfig } from './config.ts'
import { TrafficCounter } from './stats.ts'

/**
 * The model table: every name the router routes, with its backend, sleep state and traffic.
 * Configured endpoints are fixed; with `from_gateway`, the gateway's active and sleeping instances
 * join by served model name and leave when none is left (a blue-green move keeps the name, so the
 * entry and its statistics survive it). A configured name wins over a gateway instance of the same
 * name.
 */
export type SleepStateName = 'active' | 'sleeping' | 'waking'

export class ModelEntry {
  state: SleepStateName = 'active'
  /** epoch ms the model fell asleep (null while active). */
  sleepTime: number | null = null
  sleepLevel: 1 | 2 | null = null
  /** the engine operation under way; it owns `state` until it ends. */
  op: 'sleep' | 'wake' | null = null
  opPromise: Promise<void> | null = null
  /** the one wake every waiting request shares. */
  wakePromise: Promise<void> | null = null
  wakeStartedAt = 0
  /** the last failed wake, so requests do not hammer an engine that cannot wake. */
  wakeFailure: { at: number; message: string } | null = null
  /** duration of the last wake (ms), to estimate Retry-After. */
  lastWakeMs: number | null = null
  /** bumped at every operation start, so a slow probe never overwrites a newer state. */
  generation = 0
  /** requests the router is proxying right now (begin/end keep it; idle() waits for 0). */
  private open = 0
  private idleWaiters: (() => void)[] = []
  /** epoch ms of the last request arrival or end (null: no traffic yet). */
  lastActivity: number | null = null
  readonly traffic = new TrafficCounter()

  constructor(
    readonly name: string,
    readonly backend: Backend,
    /** Unix seconds, for the OpenAI-style `created`. */
    public created: number,
  ) {}

  /** inFlight: requests the router is proxying right now. */
  get inFlight(): number {
    return this.open
  }

  /** begin counts a request the router starts proxying (or holds for a wake). */
  begin(): void {
    this.open++
  }

  /** end uncounts it; the last one wakes every idle() waiter. */
  end(): void {
    this.open = Math.max(0, this.open - 1)
    if (this.open > 0 || this.idleWaiters.length === 0) return
    const waiters = this.idleWaiters
    this.idleWaiters = []
    for (const w of waiters) w()
  }

  /** idle resolves once no request of the router's is in flight (at once when none is). */
  idle(): Promise<void> {
    if (this.open === 0) return Promise.resolve()
    return new Promise((resolve) => this.idleWaiters.push(resolve))
  }

  get gateway(): GatewayBackend | null {
    return this.backend.kind === 'gateway' ? (this.backend as GatewayBackend) : null
  }

  /** busy: requests in flight on the engine, through the router or (gateway models) the gateway. */
  busy(): number {
    const gw = this.gateway
    return gw ? Math.max(this.inFlight, gw.inFlight()) : this.inFlight
  }

  /** idleMs: 0 while requests run; else time since the last activity, or since `sinceMs`. */
  idleMs(now: number, sinceMs: number): number {
    if (this.busy() > 0) return 0
    return Math.max(0, now - (this.lastActivity ?? sinceMs))
  }

  touch(now: number): void {
    if (this.lastActivity === null || now > this.lastActivity) this.lastActivity = now
  }
}

export class ModelTable {
  private readonly entries = new Map<string, ModelEntry>()
  private readonly configured = new Set<string>()
  private readonly shadowWarned = new Set<string>()
  /** instance id → gateway model, for the gateway's per-request events (O(1) on its hot path). */
  private readonly instanceIndex = new Map<string, ModelEntry>()
  private gatewayApi: GatewayApi | null = null

  constructor(
    cfg: RouterConfig,
    startedAt: number,
    private readonly log: Logger,
    /** the router's clock (epoch ms) */
    private readonly now: () => number,
  ) {
    for (const m of cfg.models) {
      const backend = new EndpointBackend(m.endpoint, cfg.control_timeout * 1000)
      this.entries.set(m.name, new ModelEntry(m.name, backend, Math.floor(startedAt / 1000)))
      this.configured.add(m.name)
    }
  }

  get(name: string): ModelEntry | undefined {
    return this.entries.get(name)
  }

  all(): IterableIterator<ModelEntry> {
    return this.entries.values()
  }

  get size(): number {
    return this.entries.size
  }

  /** byInstance finds the gateway model an instance belongs to. */
  byInstance(instanceId: string): ModelEntry | undefined {
    return this.instanceIndex.get(instanceId)
  }

  /** followGateway starts routing to the gateway's instances (then kept in sync by syncGateway). */
  followGateway(api: GatewayApi): void {
    this.gatewayApi = api
    this.syncGateway()
  }

  /**
   * syncGateway makes the gateway models match the gateway's instances (called on every instance
   * status event and at every check interval). Each entry's state follows its instances (active if
   * any is, else sleeping) unless a router operation is under way.
   */
  syncGateway(): void {
    const api = this.gatewayApi
    if (!api) return
    const byName = new Map<string, InstanceRecord[]>()
    for (const inst of api.list()) {
      if (inst.status !== 'active' && inst.status !== 'sleeping') continue
      const name = inst.served_model_name
      if (this.configured.has(name)) {
        if (!this.shadowWarned.has(name)) {
          this.shadowWarned.add(name)
          this.log.warn('a configured model shadows a gateway instance of the same name', {
            model: name,
            instance_id: inst.id,
          })
        }
        continue
      }
      const list = byName.get(name)
      if (list) list.push(inst)
      else byName.set(name, [inst])
    }
    for (const [name, instances] of byName) {
      let entry = this.entries.get(name)
      if (!entry) {
        const first = instances[0]!
        const created = Math.floor(Date.parse(first.ready_at ?? first.loaded_at) / 1000)
        entry = new ModelEntry(name, new GatewayBackend(api, name), created)
        this.entries.set(name, entry)
        this.log.info('routing to gateway model', { model: name, instances: instances.map((i) => i.id) })
      }
      entry.gateway!.instances = instances
      if (entry.op) continue
      if (instances.some((i) => i.status === 'active')) {
        entry.state = 'active'
        entry.sleepTime = null
        entry.sleepLevel = null
      } else {
        entry.state = 'sleeping'
        const slept = instances.map((i) => (i.slept_at ? Date.parse(i.slept_at) : this.now()))
        entry.sleepTime ??= Math.min(...slept)
        entry.sleepLevel ??= instances[0]!.sleep_level ?? null
      }
    }
    this.instanceIndex.clear()
    for (const [name, entry] of this.entries) {
      const gw = entry.gateway
      if (!gw) continue
      if (!byName.has(name)) {
        this.entries.delete(name)
        this.log.info('gateway model gone', { model: name })
      } else for (const i of gw.instances) this.instanceIndex.set(i.id, entry)
    }
  }
}
