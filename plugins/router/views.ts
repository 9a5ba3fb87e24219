import type { Address } from '../../src/directory/backend.ts'
import type { ModelEntry, SleepStateName } from './model-table.ts'
import { round, type TrafficSnapshot } from './stats.ts'

/**
 * Views turn the model table into the router API's resources. Timestamps are ISO 8601 (UTC); durations
 * are seconds with millisecond precision. `last_activity` is null for a model that has had no
 * traffic since the router started.
 */
export const iso = (ms: number | null): string | null => (ms === null ? null : new Date(ms).toISOString())
export const seconds = (ms: number): number => round(ms / 1000, 3)

export interface ModelView {
  id: string
  object: 'model'
  created: number
  owned_by: string
  endpoint: Address
}

/** NO_ADDRESS: the endpoint of a model with no engine to give (not loaded yet, or not shown to the caller). */
const NO_ADDRESS = { host: '', port: 0 } as const

/** modelView: a model's entry in the model list; its engine's address only when `addresses`. */
export function modelView(e: ModelEntry, addresses: boolean): ModelView {
  return {
    id: e.name,
    object: 'model',
    created: e.created,
    owned_by: 'modelgate',
    endpoint: addresses ? (e.backends()[0]?.address?.() ?? NO_ADDRESS) : NO_ADDRESS,
  }
}

export interface SleepStatusView {
  status: SleepStateName
  last_activity?: string | null
  sleep_time?: string | null
  sleep_duration?: number
  sleep_level?: number | null
}

export function sleepStatusView(e: ModelEntry, now: number): SleepStatusView {
  const s = e.sleep
  // A model with no engine (unloaded, loading) has no sleep to time: it reads as an active one does.
  if (s.status === 'active' || s.status === 'unloaded' || s.status === 'loading')
    return { status: s.status, last_activity: iso(e.lastActivity) }
  const since = s.since ?? now
  return {
    status: s.status,
    sleep_time: iso(since),
    sleep_duration: seconds(now - since),
    sleep_level: s.level,
  }
}

export interface ModelTrafficView extends TrafficSnapshot {
  model: string
  last_activity: string | null
  idle_time: number
}

export function modelTrafficView(
  e: ModelEntry,
  now: number,
  windowSeconds: number | null,
  startedAt: number,
): ModelTrafficView {
  return {
    model: e.name,
    ...e.traffic.snapshot(now, windowSeconds, startedAt),
    last_activity: iso(e.lastActivity),
    idle_time: seconds(e.idleMs(now, startedAt)),
  }
}
