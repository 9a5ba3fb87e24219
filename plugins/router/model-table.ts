import type { Backend, BackendKind, SleepState } from '../../src/directory/backend.ts'
import type { ModelDirectory } from '../../src/directory/directory.ts'
import type { Logger } from '../../src/host/logger.ts'
import type { GatewayApi } from '../gateway/api.ts'
import { EndpointBackend } from './backends.ts'
import type { RouterConfig } from './config.ts'
import { TrafficCounter } from './stats.ts'

/**
 * The router's models: every name it routes, with the router's own books on each (traffic,
 * activity). Where a model is served, and in what state, is the model directory's (src/directory):
 * a configured endpoint is one backend the router owns and adds to it; with `from_gateway`, the
 * gateway's instances of a served name that are active or sleeping are the model's backends, read
 * from the directory each time (the router keeps no copy of the gateway's state). A configured name
 * wins over gateway instances of the same name. A blue-green move keeps the name, so the model and
 * its statistics survive it.
 */
/**
 * SleepStateName: a model's state as the router shows it. The router API's three (active, sleeping,
 * waking) are the states of a model that has an engine; a gateway model served on demand may have
 * none: `unloaded` (catalogued, no instance now: not asleep, a request loads it) or `loading` (its
 * instance is starting, requests wait in its queue).
 */
export type SleepStateName = 'active' | 'sleeping' | 'waking' | 'loading' | 'unloaded'

/** ModelSleep: a model's sleep state (its backends' SleepState), with the states of a model with no engine. */
export interface ModelSleep extends Omit<SleepState, 'status'> {
  status: SleepStateName
}

const ENDPOINTS: ReadonlySet<BackendKind> = new Set(['endpoint'])
const INSTANCES: ReadonlySet<BackendKind> = new Set(['instance'])

export class ModelEntry {
  /** epoch ms of the last request arrival or end (null: no traffic yet). */
  lastActivity: number | null = null
  readonly traffic = new TrafficCounter()

  constructor(
    readonly name: string,
    /** The configured endpoint (null: the gateway's instances of this served name). */
    readonly endpoint: EndpointBackend | null,
    /** Unix seconds, for the OpenAI-style `created`. */
    readonly created: number,
    private readonly directory: ModelDirectory,
  ) {
    this.endpointList = Object.freeze(endpoint ? [endpoint] : [])
  }

  /** endpointList: the configured endpoint as a list (empty: none), made once for the directory's every request. */
  readonly endpointList: readonly EndpointBackend[]

  /** kinds: the backends a request for this model may use. */
  get kinds(): ReadonlySet<BackendKind> {
    return this.endpoint ? ENDPOINTS : INSTANCES
  }

  /** backends: where it is served now, best first (the directory's order). */
  backends(): readonly Backend[] {
    return this.endpoint ? [this.endpoint] : this.directory.candidates(this.name, INSTANCES)
  }

  /**
   * sleep: its state as the router shows it, from its backends (any serving: active). A gateway
   * model none of whose backends serves or sleeps is `loading` while an instance starts, else
   * `unloaded` (a catalogued model with no instance): never `sleeping`, which it is not.
   */
  get sleep(): ModelSleep {
    if (this.endpoint) return this.endpoint.sleepState()
    let waking: SleepState | null = null
    let sleeping: SleepState | null = null
    let operation: SleepState['operation'] = null
    for (const b of this.backends()) {
      const s = b.sleepState?.()
      if (!s) continue
      operation ??= s.operation
      if (s.status === 'active') return { ...s, operation }
      if (s.status === 'waking') waking ??= s
      else if (!sleeping || (s.since ?? Infinity) < (sleeping.since ?? Infinity)) sleeping = s
    }
    const s = waking ?? sleeping
    if (s) return { ...s, operation }
    const loading = this.backends().some((b) => b.readiness() === 'starting')
    return { status: loading ? 'loading' : 'unloaded', since: null, level: null, operation }
  }

  get state(): SleepStateName {
    return this.sleep.status
  }

  /** op: the sleep or wake under way on it (null: none). */
  get op(): ModelSleep['operation'] {
    return this.sleep.operation
  }

  /** wakePromise: an endpoint's one wake under way (a gateway model's wakes are its instances'). */
  get wakePromise(): Promise<void> | null {
    return this.endpoint?.wakePromise ?? null
  }

  /** busy: requests in flight on its backends (whoever proxies them) plus requests held for its wake. */
  busy(): number {
    let n = this.directory.held(this.name)
    for (const b of this.backends()) n += b.inFlight()
    return n
  }

  /** sleepable: whether some backend has a sleep mode (null: not known yet). */
  sleepable(): boolean | null {
    if (this.endpoint) return this.endpoint.sleepable()
    return this.backends().some((b) => b.sleepable?.() === true)
  }

  /** pinned: the host keeps it resident (a pinned catalogue entry): never an auto-sleep candidate. */
  pinned(): boolean {
    return !this.endpoint && this.backends().some((b) => b.pinned?.() === true)
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
  private readonly configured = new Map<string, ModelEntry>()
  /** The router's books on gateway models, by served name, kept while the name is served. */
  private readonly gatewayEntries = new Map<string, ModelEntry>()
  private readonly shadowWarned = new Set<string>()
  private gatewayApi: GatewayApi | null = null

  constructor(
    cfg: RouterConfig,
    startedAt: number,
    private readonly directory: ModelDirectory,
    private readonly log: Logger,
  ) {
    const created = Math.floor(startedAt / 1000)
    for (const m of cfg.models) {
      const backend = new EndpointBackend(m.name, m.endpoint, cfg.control_timeout * 1000, created)
      this.configured.set(m.name, new ModelEntry(m.name, backend, created, directory))
    }
  }

  /** endpoints: the configured endpoints, the backends the router adds to the directory. */
  endpoints(): EndpointBackend[] {
    return [...this.configured.values()].map((e) => e.endpoint!)
  }

  /** endpointList: the configured endpoint of a name as a list of one (the router's directory source). */
  endpointList(name: string): readonly EndpointBackend[] | undefined {
    return this.configured.get(name)?.endpointList
  }

  /** followGateway: route the gateway's served models too (they come from the directory). */
  followGateway(api: GatewayApi): void {
    this.gatewayApi = api
  }

  /** get: the model of a name, when the router routes it now. */
  get(name: string): ModelEntry | undefined {
    const configured = this.configured.get(name)
    if (configured) return configured
    if (!this.gatewayApi) return undefined
    const backends = this.directory.candidates(name, INSTANCES).filter((b) => b.model === name && serving(b))
    if (backends.length === 0) {
      this.gatewayEntries.delete(name)
      return undefined
    }
    let entry = this.gatewayEntries.get(name)
    if (!entry) {
      const created = Math.min(...backends.map((b) => b.created?.() ?? Math.floor(Date.now() / 1000)))
      entry = new ModelEntry(name, null, created, this.directory)
      this.gatewayEntries.set(name, entry)
      this.log.info('routing to gateway model', { model: name, instances: backends.map((b) => b.key) })
    }
    return entry
  }

  /** all: every model the router routes now: the configured ones, then the gateway's by served name. */
  all(): ModelEntry[] {
    const out = [...this.configured.values()]
    const api = this.gatewayApi
    if (!api) return out
    const names = new Set<string>()
    for (const e of api.catalog()) if (!this.configured.has(e.name)) names.add(e.name)
    for (const i of api.list()) {
      if (i.status !== 'active' && i.status !== 'sleeping') continue
      const name = i.served_model_name
      if (this.configured.has(name)) {
        if (!this.shadowWarned.has(name)) {
          this.shadowWarned.add(name)
          this.log.warn('a configured model shadows a gateway instance of the same name', {
            model: name,
            instance_id: i.id,
          })
        }
        continue
      }
      names.add(name)
    }
    for (const name of this.gatewayEntries.keys()) if (!names.has(name)) this.forget(name)
    for (const name of names) {
      const e = this.get(name)
      if (e) out.push(e)
    }
    return out
  }

  private forget(name: string): void {
    this.gatewayEntries.delete(name)
    this.log.info('gateway model gone', { model: name })
  }
}

/**
 * serving: an instance that is active or sleeping (not failed or stopping), or a catalogued model a
 * request may load (`absent`: the router lists it as unloaded, and a request brings it) or that is
 * loading (`starting` with a queue: its requests wait for the load, as the gateway's do). A model
 * loaded by hand that is still loading is not routed yet.
 */
function serving(b: Backend): boolean {
  const r = b.readiness()
  if (r === 'absent') return true
  if (r === 'starting') return (b.queue?.() ?? null) !== null
  return (b.sleepState?.() ?? null) !== null
}
