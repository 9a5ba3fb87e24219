import type { SpanBase } from '../../../src/host/telemetry/spans.ts'
import type { SleepOptions, SleepResult, WakeResult } from '../api.ts'
import type { ManagedInstance } from '../instance.ts'

/**
 * ResidencyHooks: what the gateway's service asks of the residency manager (manager.ts), so that
 * the service does not depend on the manager itself: a wake with room made first, how requests
 * for a catalogued model wait for it, and the idle rule (the router's auto-sleep).
 */
export interface ResidencyHooks {
  /** active: the manager runs (the catalogue has entries). */
  readonly active: boolean
  /** wake: with room made first; `trace`: the waiting request's span, the wake's parent. */
  wake(inst: ManagedInstance, signal?: AbortSignal, trace?: SpanBase | null): Promise<WakeResult>
  queue(name: string): { max: number; timeoutMs: number } | null
  /** abandoned: every request waiting for `name` left; true when a load only they asked for was cancelled. */
  abandoned(name: string): boolean
  /** sleepIdle: an idle instance's sleep, refused for a pinned model, recorded as a decision. */
  sleepIdle(inst: ManagedInstance, level: 1 | 2, opts: SleepOptions): Promise<SleepResult>
  /** pinned: a pinned catalogue entry's model (never slept for idleness, never evicted). */
  pinned(name: string): boolean
}
