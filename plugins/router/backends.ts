import {
  EngineCallError,
  engineOrigin,
  type HealthProbe,
  VllmClient,
  type WakePhase,
} from '../../src/engine/vllm-client.ts'
import { AppError } from '../../src/http/errors.ts'
import type { GatewayApi, InstanceRecord } from '../gateway/api.ts'
import { ActionRefused } from './errors.ts'

/**
 * Backends are how the router reaches the engine behind a model name: a configured endpoint
 * (vLLM's HTTP API called directly) or the gateway plugin's instances of one served name (sleep and
 * wake go through the gateway's api so both plugins agree on the state). Engines are called through
 * the one VllmClient: every call has a deadline and also ends when the router stops.
 */
export interface Endpoint {
  host: string
  port: number
}

/**
 * SleepCall: what a sleep is given. `signal` ends engine calls (the router stops); `cancel` ends a
 * sleep that still waits for requests in flight (a request arrived: the model is in use), and is
 * ignored once the engine was asked to sleep.
 */
export interface SleepCall {
  signal: AbortSignal
  cancel: AbortSignal
}

export interface Backend {
  readonly kind: 'endpoint' | 'gateway'
  endpoint(): Endpoint
  /** sleepable: whether the engine has sleep mode (null: not known yet). */
  sleepable(): boolean | null
  sleep(level: 1 | 2, call: SleepCall): Promise<void>
  /**
   * wake wakes the engine from the level it sleeps at (`level`; null: not known, e.g. found asleep;
   * then `fallback` unless the engine says). After level 2 that is vLLM's reload sequence.
   */
  wake(level: 1 | 2 | null, fallback: 1 | 2, signal: AbortSignal): Promise<void>
  health(timeoutMs: number, signal: AbortSignal): Promise<HealthProbe>
}

/** How the router's engine calls that end with its lifetime say so. */
const STOPPING = { abortedAs: 'the router is stopping' }

/** EndpointBackend: a configured engine, driven through vLLM's dev-mode control endpoints. */
export class EndpointBackend implements Backend {
  readonly kind = 'endpoint'
  readonly client: VllmClient
  /** the wake phases finished since the engine last fell asleep (a failed wake resumes after them). */
  private woken: WakePhase[] = []

  constructor(
    private readonly ep: Endpoint,
    private readonly controlTimeoutMs: number,
  ) {
    this.client = new VllmClient(engineOrigin(ep.host, ep.port), controlTimeoutMs, STOPPING)
  }

  get baseUrl(): string {
    return this.client.baseUrl
  }

  endpoint(): Endpoint {
    return { host: this.ep.host, port: this.ep.port }
  }

  /** sleepable: learned from the engine's answers (a 404 on /is_sleeping: no sleep mode). */
  sleepable(): boolean | null {
    return this.client.sleepMode
  }

  /**
   * sleep: the router has drained the model already (sleep.ts); `mode=wait` also spares a request
   * that reached the engine another way (an engine older than the parameter ignores it).
   */
  async sleep(level: 1 | 2, call: SleepCall): Promise<void> {
    await this.client.sleep(level, { timeoutMs: this.controlTimeoutMs, signal: call.signal, mode: 'wait' })
    this.woken = []
  }

  /**
   * wake: vLLM's wake for the level (VllmClient.wakeUp). A wake that failed half-way is resumed
   * after the phases it finished (waking a part that is awake again would fail in the engine).
   */
  async wake(level: 1 | 2 | null, fallback: 1 | 2, signal: AbortSignal): Promise<void> {
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
}

/**
 * GatewayBackend: the gateway's active and sleeping instances of one served model name. Requests
 * go through `api.acquire` (least outstanding requests, counted by the gateway); sleep and wake act
 * on every instance that can, through the gateway's api.
 */
export class GatewayBackend implements Backend {
  readonly kind = 'gateway'
  instances: InstanceRecord[] = []

  constructor(
    readonly api: GatewayApi,
    readonly servedName: string,
  ) {}

  endpoint(): Endpoint {
    const first = this.instances.find((i) => i.status === 'active') ?? this.instances[0]
    if (!first) return { host: '', port: 0 }
    const url = new URL(this.api.engineBaseUrl(first))
    return { host: url.hostname.replace(/^\[|\]$/g, ''), port: Number(url.port) || first.port }
  }

  sleepable(): boolean {
    return this.instances.some((i) => i.enable_sleep_mode)
  }

  /** inFlight: requests open on the instances, whoever proxies them (router or gateway /v1). */
  inFlight(): number {
    let n = 0
    for (const i of this.instances) n += this.api.inFlight(i.id)
    return n
  }

  /** sleep: the gateway drains each instance (its leases count the router's requests too). */
  async sleep(level: 1 | 2, call: SleepCall): Promise<void> {
    const targets = this.instances.filter((i) => i.status === 'active' && i.enable_sleep_mode)
    if (targets.length === 0) throw new ActionRefused('Model does not support sleep mode')
    await settleAll(targets.map((i) => this.api.sleep(i.id, level, { signal: call.cancel })))
  }

  /** wake: the gateway knows the level each instance sleeps at and runs its wake sequence. */
  async wake(): Promise<void> {
    const targets = this.instances.filter((i) => i.status === 'sleeping')
    await settleAll(targets.map((i) => this.api.wake(i.id)))
  }

  health(timeoutMs: number, signal: AbortSignal): Promise<HealthProbe> {
    const first = this.instances.find((i) => i.status === 'active') ?? this.instances[0]
    if (!first) return Promise.resolve({ ok: false, error: 'no instance' })
    return new VllmClient(this.api.engineBaseUrl(first), timeoutMs, STOPPING).probe({ timeoutMs, signal })
  }
}

/** settleAll waits for every call and rethrows the first failure as the router's error kinds. */
async function settleAll(calls: Promise<unknown>[]): Promise<void> {
  const results = await Promise.allSettled(calls)
  for (const r of results) {
    if (r.status === 'fulfilled') continue
    const err = r.reason
    if (err instanceof AppError && err.status >= 500) throw new EngineCallError(err.message, null)
    if (err instanceof AppError) throw new ActionRefused(err.message)
    throw err
  }
}
