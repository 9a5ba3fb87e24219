import type { Registry } from 'prom-client'
import type { EventBus } from '../../src/host/bus.ts'
import type { Logger } from '../../src/host/logger.ts'
import type { RawRoute } from '../../src/host/plugin.ts'
import { AppError } from '../../src/http/errors.ts'
import type { ForwardEnd, WireAction, WireRequest } from '../../src/wire/route.ts'
import { WakeOnRequest } from '../../src/wire/wake-on-request.ts'
import type { Lease } from '../gateway/api.ts'
import type { GatewayKeyGate } from './access.ts'
import type { EndpointBackend } from './backends.ts'
import { readInferenceBody } from './body.ts'
import type { RouterConfig } from './config.ts'
import { modelNotFound, modelWaking, wakeFailed } from './errors.ts'
import type { ModelEntry, ModelTable } from './model-table.ts'
import type { SleepController } from './sleep.ts'
import type { TrafficCounter } from './stats.ts'

/**
 * RouterInference is the router's hot path: `POST /v1/chat/completions` and `/v1/completions`,
 * served as raw routes on the router listener (the same per-request cost as the gateway's /v1).
 * It resolves the model in the table, wakes a sleeping model (reject, or hold: a decision the
 * front defers until the model is awake; src/wire/wake-on-request.ts, shared with the gateway's
 * /v1), then forwards socket to socket on the front. Every request naming a known model is counted in
 * the traffic statistics when its response has fully ended; 2xx is a success. A request refused
 * for the gateway's inference key (GatewayKeyGate, checked right after the model lookup on both
 * paths) is not: it neither counts nor touches the model, so a caller without the key can neither
 * skew a gateway model's statistics nor keep it from auto-sleep, and it never reaches the engine
 * or starts a wake.
 */
export const INFERENCE_PATHS: readonly string[] = ['/v1/chat/completions', '/v1/completions']

export interface InferenceDeps {
  table: ModelTable
  sleep: SleepController
  overall: TrafficCounter
  cfg: RouterConfig
  log: Logger
  /** the listener's keep-alive idle timeout, restored after a held or proxied request */
  idleTimeoutSeconds: number
  lifetime: AbortSignal
  /** bus: requests to gateway instances are announced as `proxy.request`, so the gateway counts them. */
  bus: EventBus
  /** gate: the gateway's inference key for gateway models (and unknown names), see access.ts. */
  gate: GatewayKeyGate
  /** the router's clock (epoch ms): activity and statistics. */
  now: () => number
  /**
   * metrics: where held requests are counted (modelgate_request_hold_seconds). Without it they are
   * still announced on the bus (`proxy.held`), which the gateway's proxy counts when it runs.
   */
  metrics?: Registry
}

const paths = new Set(INFERENCE_PATHS)

export class RouterInference {
  /** wakes: wake on request, the mechanism the gateway's /v1 shares. */
  private readonly wakes: WakeOnRequest

  constructor(private readonly deps: InferenceDeps) {
    this.wakes = new WakeOnRequest({
      policy: deps.cfg.wake_on_request,
      holdTimeoutMs: deps.cfg.hold_timeout * 1000,
      answers: { waking: modelWaking, failed: wakeFailed },
      log: deps.log,
      bus: deps.bus,
      stopping: { signal: deps.lifetime, message: 'The router is stopping' },
      ...(deps.metrics ? { metrics: deps.metrics } : {}),
    })
  }

  rawRoutes(): RawRoute[] {
    return [
      {
        match: (path, method) => method === 'POST' && paths.has(path),
        admit: (head) => this.deps.gate.admit(head.header('authorization')),
        wire: (req) => this.wire(req),
      },
    ]
  }

  /**
   * wire decides every inference request on the listener's front: a refusal, a forward, or, for a
   * model that sleeps or is waking, the wake (reject with Retry-After, or hold: a decision deferred
   * until the model is awake).
   */
  wire(req: WireRequest): WireAction {
    const fields = readInferenceBody(req.json())
    if (fields instanceof AppError) return { error: fields }
    const entry = this.deps.table.get(fields.model)
    const denied = this.deps.gate.check(entry, req.header('authorization'))
    if (denied) return { error: denied }
    if (!entry) return { error: modelNotFound(fields.model) }
    entry.touch(this.deps.now())
    if (fields.invalid) return { error: this.refusal(entry, fields.invalid, req.startedAt) }
    if (entry.state !== 'active' || entry.op === 'sleep' || entry.wakePromise !== null)
      return this.wakeFirst(entry, req)
    return this.send(entry, req, false)
  }

  /**
   * wakeFirst: the model sleeps (or is waking): the shared wake on request (src/wire/wake-on-request.ts)
   * with the router's own books: a held request counts as in flight (the model is not put back to
   * sleep under it), refusals and a client that leaves (499) are counted in the statistics.
   */
  private wakeFirst(entry: ModelEntry, req: WireRequest): WireAction {
    const { sleep } = this.deps
    return this.wakes.answer(
      {
        name: entry.name,
        recentFailure: () => sleep.recentWakeFailure(entry),
        wake: () => sleep.wake(entry),
        retryAfterSeconds: () => sleep.retryAfterSeconds(entry),
      },
      {
        ready: () => this.send(entry, req, true),
        refused: (err) => this.refusal(entry, err, req.startedAt),
        holding: (on) => (on ? entry.begin() : entry.end()),
        gone: () => this.record(entry, 499, req.startedAt),
      },
    )
  }

  /**
   * upstream: where the model is served now (a gateway model holds a lease on one instance), or the
   * gateway's refusal.
   */
  private upstream(entry: ModelEntry): { baseUrl: string; lease: Lease | null } | AppError {
    const gw = entry.gateway
    if (!gw) return { baseUrl: (entry.backend as EndpointBackend).baseUrl, lease: null }
    try {
      const lease = gw.api.acquire(gw.servedName)
      return { baseUrl: lease.baseUrl, lease }
    } catch (err) {
      const e = err instanceof AppError ? err : null
      return e && e.status !== 400 ? e : modelNotFound(entry.name)
    }
  }

  /** ender: the once-only end of a forwarded request (in-flight count, lease, statistics, event). */
  private ender(entry: ModelEntry, lease: Lease | null, path: string): (info: ForwardEnd) => void {
    let ended = false
    return (info) => {
      if (ended) return
      ended = true
      entry.end()
      if (lease) {
        lease.release()
        this.deps.bus.emit('proxy.request', {
          model: entry.name,
          instance_id: lease.instanceId,
          status: info.status,
          duration_ms: info.durationMs,
          ttft_ms: info.ttftMs,
          streamed: info.streamed,
          path,
        })
      }
      this.recordEnd(entry, info.status, info.durationMs)
    }
  }

  /**
   * send forwards to where the model is served now. `afterWake`: the request was held for a wake;
   * a gateway that answers model_sleeping then is refused, not woken again.
   */
  private send(entry: ModelEntry, req: WireRequest, afterWake: boolean): WireAction {
    const upstream = this.upstream(entry)
    if (upstream instanceof AppError) {
      // The gateway saw a sleep before its event reached us: wake it as any sleeping model.
      if (upstream.code === 'model_sleeping' && !afterWake) {
        this.deps.table.syncGateway()
        if (entry.state === 'sleeping') return this.wakeFirst(entry, req)
      }
      return { error: this.refusal(entry, upstream, req.startedAt) }
    }
    entry.begin()
    const { cfg } = this.deps
    return {
      forward: {
        origin: upstream.baseUrl,
        target: req.path + req.query,
        body: req.body,
        firstByteTimeoutMs: cfg.proxy.first_byte_timeout_ms,
        connectTimeoutMs: cfg.proxy.connect_timeout_ms,
        onEnd: this.ender(entry, upstream.lease, req.path),
      },
    }
  }

  private refusal(entry: ModelEntry, err: AppError, startedAt: number): AppError {
    this.record(entry, err.status, startedAt)
    return err
  }

  private record(entry: ModelEntry, status: number, startedAt: number): void {
    this.recordEnd(entry, status, performance.now() - startedAt)
  }

  private recordEnd(entry: ModelEntry, status: number, durationMs: number): void {
    const now = this.deps.now()
    const ok = status >= 200 && status < 300
    entry.traffic.record(now, ok, durationMs)
    this.deps.overall.record(now, ok, durationMs)
    entry.touch(now)
  }
}
