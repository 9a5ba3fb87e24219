import { Type as T } from '@sinclair/typebox'
import { Histogram, type Registry } from 'prom-client'
import { abortable, WaitError } from '../host/abortable.ts'
import type { EventBus } from '../host/bus.ts'
import type { Logger } from '../host/logger.ts'
import { METRIC_PREFIX } from '../host/metrics.ts'
import type { AppError } from '../http/errors.ts'
import type { WireAction } from './route.ts'

/**
 * Wake on request: what a hot route does with a request for a model that sleeps, the same on every
 * listener that serves sleeping models (the gateway's /v1, the router's inference routes). The
 * request starts the model's one wake (or joins the one under way), then, by the listener's
 * `wake_on_request`:
 *
 * - `reject`: 503 at once, with `Retry-After` the rest of the wake as the model's last measured
 *   wake predicts it (the listener's default when none was measured);
 * - `hold`: a decision the front defers (WireAction.defer: no idle timeout, counted for the
 *   shutdown drain) until the model takes requests, then the listener plans the request again
 *   (`ready`), so it reaches the engine only once the wake has finished. At `hold_timeout` it is
 *   503 with Retry-After; a client that goes away stops waiting (the wake goes on); a wake that
 *   fails is 502 `wake_failed`, and for WAKE_RETRY_MS after a failure requests are refused at once
 *   instead of each starting another.
 *
 * What a model is, how it wakes and what the answers say belong to the listener (SleepingModel,
 * WakeAnswers); the choice, the wait and its deadline are here, once. Every held request is
 * announced on the bus as `proxy.held` with how long it waited and how the wait ended, and counted
 * in `modelgate_request_hold_seconds{model,outcome}` by whoever registers it (the gateway's proxy).
 */
export type WakePolicy = 'reject' | 'hold'

/** WakeOnRequestKeys: the YAML keys of the choice, the same wherever it is offered. */
export const WakeOnRequestKeys = {
  wake_on_request: T.Union([T.Literal('reject'), T.Literal('hold')], {
    default: 'reject',
    description:
      'a request for a sleeping model starts its wake, then: reject → 503 with Retry-After (the rest of ' +
      'the wake, from the last one measured); hold → the request waits until the model takes requests ' +
      '(up to hold_timeout) and is then forwarded',
  }),
  hold_timeout: T.Integer({
    default: 120,
    minimum: 1,
    description: 'seconds a held request waits for the wake before 503 with Retry-After',
  }),
}

/** WAKE_RETRY_MS: after a failed wake, requests are refused (502 wake_failed) this long before a new try. */
export const WAKE_RETRY_MS = 10_000

/** SleepingModel: a model a request found asleep, as the listener that serves it knows it. */
export interface SleepingModel {
  /** The served model name: error messages and the `model` metric label. */
  readonly name: string
  /** recentFailure: why the last wake failed, while requests should not start another; else null. */
  recentFailure(): string | null
  /** wake starts the model's one wake or joins the one under way; it resolves once it takes requests. */
  wake(): Promise<void>
  /** retryAfterSeconds: the rest of the wake in whole seconds (≥ 1), from measured wakes. */
  retryAfterSeconds(): number
}

/** WakeAnswers: a listener's refusals, in its own vocabulary. */
export interface WakeAnswers {
  /** 503 with Retry-After while the model wakes (reject, the hold's deadline, a stop). */
  waking(model: string, retryAfterSeconds: number, message?: string): AppError
  /** 502: the wake failed. */
  failed(model: string, reason: string): AppError
}

/** HeldRequest: what the listener does around one request for a sleeping model. */
export interface HeldRequest {
  /** ready: the action once the model is awake (the request planned again; never another wake). */
  ready(): WireAction
  /** refused: a refusal about to be answered (the router counts it); returns what to answer. */
  refused?(err: AppError): AppError
  /** holding: the hold begins (true) or ends (false). */
  holding?(on: boolean): void
  /** gone: the client went away while held. */
  gone?(): void
}

/** HoldOutcome: how a hold ended. */
export type HoldOutcome = 'awake' | 'timeout' | 'client_gone' | 'wake_failed' | 'stopping'

/** HeldRequestEvent: one held request, announced when its hold ended. */
export interface HeldRequestEvent {
  model: string
  outcome: HoldOutcome
  held_ms: number
}

declare module '../host/bus.ts' {
  interface BusEvents {
    'proxy.held': HeldRequestEvent
  }
}

export interface WakeOnRequestOptions {
  policy: WakePolicy
  holdTimeoutMs: number
  answers: WakeAnswers
  log: Logger
  bus: EventBus
  /** metrics: the registry to count held requests in (once per registry; any listener's holds count). */
  metrics?: Registry
  /** stopping: aborted when the listener's plugin stops; held requests then get `message`. */
  stopping?: { signal: AbortSignal; message: string }
}

export class WakeOnRequest {
  constructor(private readonly o: WakeOnRequestOptions) {
    if (o.metrics) registerHoldMetrics(o.metrics, o.bus)
  }

  /** answer decides a request whose model sleeps: a refusal, or a hold deferred until it is awake. */
  answer(model: SleepingModel, req: HeldRequest): WireAction {
    const { answers, log, policy } = this.o
    const refused = (err: AppError) => ({ error: req.refused ? req.refused(err) : err })
    const failure = model.recentFailure()
    if (failure) return refused(answers.failed(model.name, failure))
    let wake: Promise<void>
    try {
      wake = model.wake()
    } catch (err) {
      wake = Promise.reject(err)
    }
    wake.catch((err: Error) => log.warn('wake on request failed', { model: model.name, error: err.message }))
    if (policy === 'reject') return refused(answers.waking(model.name, model.retryAfterSeconds()))
    return { defer: (signal) => this.hold(model, wake, req, signal) }
  }

  private async hold(
    model: SleepingModel,
    wake: Promise<void>,
    req: HeldRequest,
    client: AbortSignal,
  ): Promise<WireAction> {
    const { answers, holdTimeoutMs, stopping } = this.o
    const t0 = performance.now()
    req.holding?.(true)
    let outcome: HoldOutcome = 'awake'
    let reason = ''
    try {
      const signal = stopping ? AbortSignal.any([client, stopping.signal]) : client
      await abortable(wake, { signal, timeoutMs: holdTimeoutMs, what: `the wake of ${model.name}` })
    } catch (err) {
      if (!(err instanceof WaitError)) {
        outcome = 'wake_failed'
        reason = (err as Error).message
      } else if (err.kind === 'timeout') outcome = 'timeout'
      else outcome = client.aborted ? 'client_gone' : 'stopping'
    } finally {
      req.holding?.(false)
    }
    this.o.bus.emit('proxy.held', { model: model.name, outcome, held_ms: performance.now() - t0 })
    const refused = (err: AppError) => ({ error: req.refused ? req.refused(err) : err })
    switch (outcome) {
      case 'awake':
        return req.ready()
      case 'client_gone':
        req.gone?.()
        return { error: answers.waking(model.name, 0, 'The client went away') }
      case 'timeout':
        return refused(
          answers.waking(
            model.name,
            model.retryAfterSeconds(),
            `Model '${model.name}' did not wake up within ${holdTimeoutMs / 1000} s; retry later`,
          ),
        )
      case 'stopping':
        return refused(answers.waking(model.name, 5, stopping?.message))
      case 'wake_failed':
        return refused(answers.failed(model.name, reason))
    }
  }
}

/**
 * WakeRecord: one model's wakes, as a listener that does not run them itself measures them: how
 * long the last one took (the Retry-After estimate), the one under way, the last failure.
 * Times are the caller's clock in milliseconds.
 */
export class WakeRecord {
  /** lastMs: how long the last wake took; null until one was measured. */
  lastMs: number | null = null
  private startedAt: number | null = null
  private failure: { at: number; message: string } | null = null

  started(at: number): void {
    this.startedAt = at
  }

  /** succeeded: the model takes requests again; a wake seen starting is measured. */
  succeeded(at: number): void {
    if (this.startedAt !== null) this.lastMs = at - this.startedAt
    this.startedAt = null
    this.failure = null
  }

  /** ended: the wake under way ended without waking the model (nothing measured). */
  ended(): void {
    this.startedAt = null
  }

  failed(at: number, message: string): void {
    this.startedAt = null
    this.failure = { at, message }
  }

  /** retryAfterSeconds: the last wake's duration minus the time already spent, at least 1; null when none was measured. */
  retryAfterSeconds(now: number): number | null {
    if (this.lastMs === null) return null
    const elapsed = this.startedAt === null ? 0 : now - this.startedAt
    return Math.max(1, Math.ceil((this.lastMs - elapsed) / 1000))
  }

  /** recentFailure names the last failure while its retry delay lasts, else null. */
  recentFailure(now: number): string | null {
    const f = this.failure
    const ago = f ? now - f.at : 0
    if (!f || ago >= WAKE_RETRY_MS) return null
    return `the last wake failed ${Math.round(ago / 1000)} s ago (${f.message}); retrying after ${WAKE_RETRY_MS / 1000} s`
  }
}

const HOLD_METRIC = `${METRIC_PREFIX}request_hold_seconds`
/** Buckets from a wake of a cached level-1 sleep (tenths of a second) to a level-2 reload (minutes). */
const HOLD_BUCKETS_SECONDS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600]

/**
 * registerHoldMetrics: `modelgate_request_hold_seconds{model,outcome}`, every `proxy.held` event
 * on the bus, whichever listener held the request. Once per registry.
 */
export function registerHoldMetrics(registry: Registry, bus: EventBus): void {
  if (registry.getSingleMetric(HOLD_METRIC)) return
  const held = new Histogram({
    name: HOLD_METRIC,
    help:
      'Time inference requests spent held while their model woke up, by served model name and how the ' +
      'hold ended (awake: forwarded; timeout; client_gone; wake_failed; stopping)',
    labelNames: ['model', 'outcome'],
    buckets: HOLD_BUCKETS_SECONDS,
    registers: [registry],
  })
  bus.on('proxy.held', (e) => held.observe({ model: e.model, outcome: e.outcome }, e.held_ms / 1000))
}
