/**
 * TrafficCounter keeps one scope's traffic statistics (one model, or all of them) in bounded
 * memory however long the router runs: all-time totals, per-second buckets for the last hour and
 * per-minute buckets for the last day, each a ring of typed arrays. Recording a request is O(1)
 * (two bucket updates); a windowed query walks at most 3600 buckets. A request is recorded when
 * its response has fully ended (the last byte of a stream), with its full duration.
 */
export interface TrafficSnapshot {
  total_requests: number
  successful_requests: number
  failed_requests: number
  /** requests per minute over the window (or since the router started) */
  request_rate: number
  /** seconds */
  avg_response_time: number
}

/** Windows up to an hour are answered at one-second resolution (3600 + the current second), longer ones per minute. */
export const SECOND_RING = 3601
/** Longest window answered at all (a day); longer windows are answered over this span. */
export const MAX_WINDOW_SECONDS = 24 * 3600
const MINUTE_RING = MAX_WINDOW_SECONDS / 60 + 1

class Ring {
  private readonly stamp: Float64Array
  private readonly total: Uint32Array
  private readonly ok: Uint32Array
  private readonly durMs: Float64Array

  constructor(
    private readonly size: number,
    private readonly unitMs: number,
  ) {
    this.stamp = new Float64Array(size).fill(-1)
    this.total = new Uint32Array(size)
    this.ok = new Uint32Array(size)
    this.durMs = new Float64Array(size)
  }

  add(nowMs: number, success: boolean, durationMs: number): void {
    const k = Math.floor(nowMs / this.unitMs)
    const i = k % this.size
    if (this.stamp[i] !== k) {
      this.stamp[i] = k
      this.total[i] = 0
      this.ok[i] = 0
      this.durMs[i] = 0
    }
    this.total[i]!++
    if (success) this.ok[i]!++
    this.durMs[i]! += durationMs
  }

  /** sum adds the last `units` buckets (the current one included). */
  sum(nowMs: number, units: number, out: Totals): void {
    const k = Math.floor(nowMs / this.unitMs)
    const n = Math.min(units, this.size)
    for (let j = 0; j < n; j++) {
      const key = k - j
      if (key < 0) break
      const i = key % this.size
      if (this.stamp[i] !== key) continue
      out.total += this.total[i]!
      out.ok += this.ok[i]!
      out.durMs += this.durMs[i]!
    }
  }
}

interface Totals {
  total: number
  ok: number
  durMs: number
}

export class TrafficCounter {
  private total = 0
  private ok = 0
  private durMs = 0
  private readonly seconds = new Ring(SECOND_RING, 1000)
  private readonly minutes = new Ring(MINUTE_RING, 60_000)

  /** record counts one finished request; success means a 2xx outcome. */
  record(nowMs: number, success: boolean, durationMs: number): void {
    this.total++
    if (success) this.ok++
    this.durMs += durationMs
    this.seconds.add(nowMs, success, durationMs)
    this.minutes.add(nowMs, success, durationMs)
  }

  /**
   * snapshot: statistics over the last `windowSeconds` (null: since `sinceMs`, the router's start).
   * The rate divides by the span actually covered: the window, or less when the router is younger.
   */
  snapshot(nowMs: number, windowSeconds: number | null, sinceMs: number): TrafficSnapshot {
    const uptime = Math.max(0, (nowMs - sinceMs) / 1000)
    let t: Totals
    let span: number
    if (windowSeconds === null) {
      t = { total: this.total, ok: this.ok, durMs: this.durMs }
      span = uptime
    } else {
      const w = Math.min(windowSeconds, MAX_WINDOW_SECONDS)
      t = { total: 0, ok: 0, durMs: 0 }
      // The current (partial) bucket plus the N before it: never less than the window.
      if (w < SECOND_RING) this.seconds.sum(nowMs, w + 1, t)
      else this.minutes.sum(nowMs, Math.ceil(w / 60) + 1, t)
      span = Math.min(w, uptime)
    }
    return {
      total_requests: t.total,
      successful_requests: t.ok,
      failed_requests: t.total - t.ok,
      request_rate: round(t.total / (Math.max(span, 1) / 60), 3),
      avg_response_time: t.total === 0 ? 0 : round(t.durMs / t.total / 1000, 6),
    }
  }
}

export function round(x: number, digits: number): number {
  const f = 10 ** digits
  return Math.round(x * f) / f
}
