/** Addresses tracked by one RateWindows before idle ones are forgotten. */
const MAX_TRACKED_ADDRESSES = 10_000

/** Window: the last `limit` counted arrival times of one address (a ring). */
interface Window {
  times: Float64Array
  next: number
  count: number
}

/**
 * RateWindows: at most `limit` counted events per source address in any sliding second. It is the
 * internal API's rate limit (InternalVerifier), kept apart from what it counts: every request to a
 * limited path, and every request that fails verification. `take` counts and refuses past the limit;
 * `wait` only asks. Refused events are never counted, so a sender that slows down gets through.
 */
export class RateWindows {
  private readonly windows = new Map<string, Window>()

  constructor(readonly limit: number) {}

  /** take counts one event from `peer`; returns 0, or the seconds to wait when over the limit (not counted). */
  take(peer: string, now: number): number {
    let w = this.windows.get(peer)
    if (!w) {
      if (this.windows.size >= MAX_TRACKED_ADDRESSES) this.forgetIdle(now)
      w = { times: new Float64Array(this.limit), next: 0, count: 0 }
      this.windows.set(peer, w)
    }
    const wait = waitOf(w, this.limit, now)
    if (wait > 0) return wait
    if (w.count < this.limit) w.count++
    w.times[w.next] = now
    w.next = (w.next + 1) % this.limit
    return 0
  }

  /** wait: what take would answer for `peer` now, without counting anything. */
  wait(peer: string, now: number): number {
    const w = this.windows.get(peer)
    return w ? waitOf(w, this.limit, now) : 0
  }

  /** forgetIdle drops the windows of addresses silent for a second (they hold nothing that counts). */
  private forgetIdle(now: number): void {
    for (const [peer, w] of this.windows) {
      const newest = w.times[(w.next + this.limit - 1) % this.limit]!
      if (now - newest >= 1000) this.windows.delete(peer)
    }
  }
}

/** waitOf: 0 while `w` has room, else the whole seconds until its oldest event is a second old. */
function waitOf(w: Window, limit: number, now: number): number {
  if (w.count < limit) return 0
  // times[next] is the oldest of the last `limit` counted events.
  const oldest = w.times[w.next]!
  return now - oldest < 1000 ? Math.max(1, Math.ceil((oldest + 1000 - now) / 1000)) : 0
}
