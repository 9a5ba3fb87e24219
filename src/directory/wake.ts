import { Type as T } from '@sinclair/typebox'
import { Histogram, type Registry } from 'prom-client'
import type { EventBus } from '../host/bus.ts'
import { METRIC_PREFIX } from '../host/metrics.ts'

/**
 * Wake on request, the policy every listener offers for a request whose model sleeps (the
 * directory, directory.ts, carries it out once for all of them): the request starts the model's
 * one wake (or joins the one under way), then
 *
 * - `reject`: 503 at once, with `Retry-After` the rest of the wake as the model's last measured
 *   wake predicts it (WakeRecord);
 * - `hold`: the request waits (the front defers it: no idle timeout, counted for the shutdown
 *   drain) until the model takes requests, then it is resolved again and forwarded. At
 *   `hold_timeout` it is 503 with Retry-After; a client that goes away stops waiting (the wake goes
 *   on); a wake that fails is 502 `wake_failed`, and for WAKE_RETRY_MS after a failure requests are
 *   refused at once instead of each starting another.
 *
 * Every held request is announced on the bus as `proxy.held` with how long it waited and how the
 * wait ended, and counted in `modelgate_request_hold_seconds{model,outcome}`.
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

/** HoldOutcome: how a hold ended (`displaced`: a request of higher priority took its place in a full queue). */
export type HoldOutcome = 'awake' | 'timeout' | 'client_gone' | 'wake_failed' | 'stopping' | 'displaced'

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

/** WAKE_RETRY_MS: after a failed wake, requests are refused (502 wake_failed) this long before a new try. */
export const WAKE_RETRY_MS = 10_000

/**
 * WakeRecord: one model's wakes, whoever ran them (a request, an operator, the router), as the
 * backends report them to the directory: how long the last one took (the one Retry-After estimate),
 * the one under way, the last failure. Times are performance.now() milliseconds.
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

  /** clearFailure: an operator's explicit wake retries at once, whatever failed before. */
  clearFailure(): void {
    this.failure = null
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
      'hold ended (awake: forwarded; timeout; client_gone; wake_failed; stopping; displaced)',
    labelNames: ['model', 'outcome'],
    buckets: HOLD_BUCKETS_SECONDS,
    registers: [registry],
  })
  bus.on('proxy.held', (e) => held.observe({ model: e.model, outcome: e.outcome }, e.held_ms / 1000))
}
