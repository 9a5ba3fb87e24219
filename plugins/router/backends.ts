import { AppError } from '../../src/http/errors.ts'
import type { GatewayApi, InstanceRecord } from '../gateway/api.ts'
import { ActionRefused, EngineUnavailable } from './errors.ts'

/**
 * Backends are how the router reaches the engine behind a model name: a configured endpoint
 * (vLLM's HTTP API called directly) or the gateway plugin's instances of one served name (sleep and
 * wake go through the gateway's api so both plugins agree on the state). Every engine call has a
 * deadline and also ends when the router stops.
 */
export interface Endpoint {
  host: string
  port: number
}

export type HealthProbe = { ok: true; seconds: number } | { ok: false; error: string }

export interface Backend {
  readonly kind: 'endpoint' | 'gateway'
  endpoint(): Endpoint
  /** sleepable: whether the engine has sleep mode (null: not known yet). */
  sleepable(): boolean | null
  sleep(level: 1 | 2, signal: AbortSignal): Promise<void>
  wake(signal: AbortSignal): Promise<void>
  health(timeoutMs: number, signal: AbortSignal): Promise<HealthProbe>
}

/** probeHealth: GET /health with a deadline; 200 is healthy. */
export async function probeHealth(
  baseUrl: string,
  timeoutMs: number,
  signal: AbortSignal,
): Promise<HealthProbe> {
  const t0 = performance.now()
  try {
    const init: BunFetchRequestInit = {
      signal: AbortSignal.any([AbortSignal.timeout(timeoutMs), signal]),
      proxy: false,
    }
    const res = await fetch(`${baseUrl}/health`, init)
    await res.body?.cancel()
    if (res.status === 200) return { ok: true, seconds: (performance.now() - t0) / 1000 }
    return { ok: false, error: `engine /health answered ${res.status}` }
  } catch (err) {
    return { ok: false, error: describeFailure(err, timeoutMs) }
  }
}

function describeFailure(err: unknown, timeoutMs: number): string {
  const e = err as { name?: string; code?: string; message?: string }
  if (e?.name === 'TimeoutError') return `no answer within ${timeoutMs} ms`
  if (e?.name === 'AbortError') return 'the router is stopping'
  if (e?.code === 'ConnectionRefused' || e?.code === 'ECONNREFUSED') return 'connection refused'
  return e?.code ?? e?.message ?? 'connection failed'
}

/** EndpointBackend: a configured engine, driven through vLLM's dev-mode control endpoints. */
export class EndpointBackend implements Backend {
  readonly kind = 'endpoint'
  readonly baseUrl: string
  /** known: learned from /is_sleeping (404 means the engine runs without sleep mode). */
  private hasSleep: boolean | null = null

  constructor(
    private readonly ep: Endpoint,
    private readonly controlTimeoutMs: number,
  ) {
    const host = ep.host.includes(':') && !ep.host.startsWith('[') ? `[${ep.host}]` : ep.host
    this.baseUrl = `http://${host}:${ep.port}`
  }

  endpoint(): Endpoint {
    return { host: this.ep.host, port: this.ep.port }
  }

  sleepable(): boolean | null {
    return this.hasSleep
  }

  private async call(
    method: string,
    path: string,
    timeoutMs: number,
    signal: AbortSignal,
  ): Promise<Response> {
    let res: Response
    try {
      const init: BunFetchRequestInit = {
        method,
        signal: AbortSignal.any([AbortSignal.timeout(timeoutMs), signal]),
        // Engines are addressed directly, never through an HTTP_PROXY from the environment.
        proxy: false,
      }
      res = await fetch(`${this.baseUrl}${path}`, init)
    } catch (err) {
      throw new EngineUnavailable(`engine ${method} ${path} failed: ${describeFailure(err, timeoutMs)}`)
    }
    if (res.status === 404 && path !== '/health') this.hasSleep = false
    if (!res.ok) {
      const text = (await res.text().catch(() => '')).slice(0, 200)
      throw new EngineUnavailable(`engine ${method} ${path} answered ${res.status}${text ? `: ${text}` : ''}`)
    }
    return res
  }

  async sleep(level: 1 | 2, signal: AbortSignal): Promise<void> {
    await (await this.call('POST', `/sleep?level=${level}`, this.controlTimeoutMs, signal)).body?.cancel()
    this.hasSleep = true
  }

  async wake(signal: AbortSignal): Promise<void> {
    await (await this.call('POST', '/wake_up', this.controlTimeoutMs, signal)).body?.cancel()
  }

  /** isSleeping reads the engine's own view; null when the engine has no sleep endpoints. */
  async isSleeping(timeoutMs: number, signal: AbortSignal): Promise<boolean | null> {
    try {
      const body = (await (await this.call('GET', '/is_sleeping', timeoutMs, signal)).json()) as {
        is_sleeping?: unknown
      }
      this.hasSleep = true
      return body.is_sleeping === true
    } catch (err) {
      if (this.hasSleep === false) return null
      throw err
    }
  }

  health(timeoutMs: number, signal: AbortSignal): Promise<HealthProbe> {
    return probeHealth(this.baseUrl, timeoutMs, signal)
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

  async sleep(level: 1 | 2): Promise<void> {
    const targets = this.instances.filter((i) => i.status === 'active' && i.enable_sleep_mode)
    if (targets.length === 0) throw new ActionRefused('Model does not support sleep mode')
    await settleAll(targets.map((i) => this.api.sleep(i.id, level)))
  }

  async wake(): Promise<void> {
    const targets = this.instances.filter((i) => i.status === 'sleeping')
    await settleAll(targets.map((i) => this.api.wake(i.id)))
  }

  health(timeoutMs: number, signal: AbortSignal): Promise<HealthProbe> {
    const first = this.instances.find((i) => i.status === 'active') ?? this.instances[0]
    if (!first) return Promise.resolve({ ok: false, error: 'no instance' })
    return probeHealth(this.api.engineBaseUrl(first), timeoutMs, signal)
  }
}

/** settleAll waits for every call and rethrows the first failure as the router's error kinds. */
async function settleAll(calls: Promise<unknown>[]): Promise<void> {
  const results = await Promise.allSettled(calls)
  for (const r of results) {
    if (r.status === 'fulfilled') continue
    const err = r.reason
    if (err instanceof AppError && err.status >= 500) throw new EngineUnavailable(err.message)
    if (err instanceof AppError) throw new ActionRefused(err.message)
    throw err
  }
}
