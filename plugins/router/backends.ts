import type {
  Address,
  Backend,
  BackendRequest,
  LeaseHandle,
  Readiness,
  SleepState,
} from '../../src/directory/backend.ts'
import { engineCall, traced } from '../../src/directory/trace.ts'
import {
  EngineCallError,
  type EngineClient,
  engineOrigin,
  type HealthProbe,
  type WakePhase,
} from '../../src/engine/engine-client.ts'
import { DEFAULT_ENGINE_KIND, type EngineKind, engineDriver } from '../../src/engine/kinds.ts'
import { abortable, WaitError } from '../../src/host/abortable.ts'
import type { WireAction } from '../../src/wire/route.ts'
import { ActionRefused } from './errors.ts'

/**
 * EndpointBackend: an engine the router reaches by its configured address (`plugins.router.models`),
 * as the model directory serves it (src/directory/backend.ts): its OpenAI API called directly, its
 * sleep and wake through its kind's driver's control client (`endpoint.engine_kind`, default vLLM's
 * dev-mode endpoints; every call has a deadline and also ends when the router stops). Its sleep state is kept here and changed only
 * by the router's SleepController (sleep.ts), which also runs its one wake (`waker`).
 */
export interface Endpoint {
  host: string
  port: number
  /** engine_kind: the engine at that address (default vllm) */
  engine_kind?: EngineKind
}

/** How the router's engine calls that end with its lifetime say so. */
const STOPPING = { abortedAs: 'the router is stopping' }

export class EndpointBackend implements Backend {
  readonly kind = 'endpoint'
  readonly local = true
  readonly key: string
  readonly client: EngineClient
  /** The sleep state; `op` (the sleep or wake under way) owns it until it ends. */
  state: 'active' | 'sleeping' | 'waking' = 'active'
  /** Epoch ms (router's clock) it fell asleep; null while active. */
  sleepTime: number | null = null
  sleepLevel: 1 | 2 | null = null
  op: 'sleep' | 'wake' | null = null
  opPromise: Promise<void> | null = null
  /** The one wake every waiting request, operator and policy shares. */
  wakePromise: Promise<void> | null = null
  /** Bumped at every operation start, so a slow probe never overwrites a newer state. */
  generation = 0
  /** waker: the router's wake of this endpoint (SleepController), set when the router starts. */
  waker: (() => Promise<void>) | null = null
  /** The wake phases finished since the engine last fell asleep (a failed wake resumes after them). */
  private woken: WakePhase[] = []
  /** Requests in flight (leases); the sleep's drain waits on the last one's end. */
  private open = 0
  private idleWaiters: (() => void)[] = []

  constructor(
    readonly model: string,
    private readonly ep: Endpoint,
    private readonly controlTimeoutMs: number,
    /** Unix seconds, for the OpenAI-style `created`. */
    private readonly createdAt: number,
  ) {
    this.key = `endpoint:${model}`
    const driver = engineDriver(ep.engine_kind ?? DEFAULT_ENGINE_KIND)
    this.client = driver.client(engineOrigin(ep.host, ep.port), controlTimeoutMs, STOPPING)
  }

  get baseUrl(): string {
    return this.client.baseUrl
  }

  readiness(): Readiness {
    if (this.state === 'waking') return 'waking'
    if (this.state === 'sleeping' || this.op === 'sleep') return 'asleep'
    return 'ready'
  }

  inFlight(): number {
    return this.open
  }

  acquire(): void {
    this.open++
  }

  release(): void {
    this.open = Math.max(0, this.open - 1)
    if (this.open > 0 || this.idleWaiters.length === 0) return
    const waiters = this.idleWaiters
    this.idleWaiters = []
    for (const w of waiters) w()
  }

  /** idle resolves once no request is in flight (at once when none is). */
  idle(): Promise<void> {
    if (this.open === 0) return Promise.resolve()
    return new Promise((resolve) => this.idleWaiters.push(resolve))
  }

  wake(): Promise<void> {
    return this.waker ? this.waker() : Promise.reject(new Error('the router has not started'))
  }

  sleepState(): SleepState {
    return { status: this.state, since: this.sleepTime, level: this.sleepLevel, operation: this.op }
  }

  /** sleepable: learned from the engine's answers (a 404 on /is_sleeping: no sleep mode). */
  sleepable(): boolean | null {
    return this.client.sleepMode
  }

  /**
   * sleepEngine drains the requests the router forwards here, then asks the engine to sleep (`mode=wait`
   * also spares a request that reached it another way; an engine older than the parameter ignores
   * it). The drain ends at control_timeout (ActionRefused: the model keeps serving), when `cancel`
   * fires (a request arrived: the model is in use) or when the router stops (`lifetime`).
   */
  async sleepEngine(level: 1 | 2, cancel: AbortSignal, lifetime?: AbortSignal): Promise<void> {
    const stop = lifetime ?? cancel
    if (this.open > 0) {
      try {
        await abortable(this.idle(), {
          signal: AbortSignal.any([cancel, stop]),
          timeoutMs: this.controlTimeoutMs,
          what: 'the requests in flight',
        })
      } catch (err) {
        if (!(err instanceof WaitError)) throw err
        if (stop.aborted && !cancel.aborted) throw new EngineCallError('the router is stopping', null)
        if (cancel.aborted)
          throw new ActionRefused(
            `A request arrived while the sleep waited for ${this.open} request(s) in flight; the model keeps serving`,
          )
        throw new ActionRefused(
          `Model still has ${this.open} request(s) in flight after ${this.controlTimeoutMs / 1000} s; ` +
            'it was not put to sleep and keeps serving',
        )
      }
    }
    await this.client.sleep(level, { timeoutMs: this.controlTimeoutMs, signal: stop, mode: 'wait' })
    this.woken = []
  }

  /**
   * wakeEngine: the engine's wake for the level it sleeps at (its client's wakeUp; null: not known, then
   * the engine's own answer, else `fallback`). A wake that failed half-way is resumed after the
   * phases it finished (waking a part that is awake again would fail in the engine).
   */
  async wakeEngine(level: 1 | 2 | null, fallback: 1 | 2, signal: AbortSignal): Promise<void> {
    const o = { timeoutMs: this.controlTimeoutMs, signal }
    let slept = level
    if (slept === null) {
      const reported = await this.client.sleepLevel(o).catch(() => null)
      slept = reported === 1 || reported === 2 ? reported : fallback
    }
    await this.client.wakeUp(slept, [], { ...o, done: this.woken, onPhase: (p) => this.woken.push(p) })
    this.woken = []
  }

  /** isSleeping reads the engine's own view; null when the engine has no sleep endpoints. */
  async isSleeping(timeoutMs: number, signal: AbortSignal): Promise<boolean | null> {
    try {
      return await this.client.isSleeping({ timeoutMs, signal })
    } catch (err) {
      if (this.client.sleepMode === false) return null
      throw err
    }
  }

  health(timeoutMs: number, signal: AbortSignal): Promise<HealthProbe> {
    return this.client.probe({ timeoutMs, signal })
  }

  address(): Address {
    return { host: this.ep.host, port: this.ep.port }
  }

  created(): number {
    return this.createdAt
  }

  forward(req: BackendRequest, lease: LeaseHandle): WireAction {
    const forward = {
      origin: this.client.baseUrl,
      target: req.path + req.query,
      body: req.body,
      firstByteTimeoutMs: req.firstByteTimeoutMs,
      connectTimeoutMs: req.connectTimeoutMs,
      onEnd: lease.end,
    }
    const trace = req.trace
    if (!trace) return { forward }
    const { host, port } = this.ep
    const call = engineCall(
      trace,
      { host, port, path: req.path, model: this.model },
      { 'modelgate.endpoint': this.key },
    )
    return { forward: traced(call, forward) }
  }
}
