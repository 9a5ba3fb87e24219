/**
 * Ticker runs the proxy's slow-path checks for all requests in flight from one shared interval,
 * instead of arming timers and listeners per request: a request that completes within a tick (the
 * common case for short replies) costs a Set insert and delete. Watched requests get `tick(now)`
 * every TICK_MS until they unwatch themselves; deadlines are therefore honoured within TICK_MS.
 */
export const TICK_MS = 50

export interface Watched {
  /** tick runs every TICK_MS with performance.now(). */
  tick(now: number): void
}

const watched = new Set<Watched>()
let timer: ReturnType<typeof setInterval> | undefined
let emptyTicks = 0

function sweep(): void {
  if (watched.size === 0) {
    // Stop once idle for a while; the next watch() starts it again.
    if (++emptyTicks > 20) {
      clearInterval(timer)
      timer = undefined
    }
    return
  }
  emptyTicks = 0
  const now = performance.now()
  for (const w of watched) {
    try {
      w.tick(now)
    } catch (err) {
      watched.delete(w)
      console.error('proxy ticker: a watched request failed', err)
    }
  }
}

export function watch(w: Watched): void {
  watched.add(w)
  if (timer === undefined) {
    emptyTicks = 0
    timer = setInterval(sweep, TICK_MS)
    timer.unref?.()
  }
}

export function unwatch(w: Watched): void {
  watched.delete(w)
}

/** watchedCount is for tests: requests still under watch. */
export function watchedCount(): number {
  return watched.size
}
