/**
 * ResidencyClock: where the manager reads time and sets its timers: epoch ms, the monotonic ms the
 * lifecycle stamps its events with, a timer, and a deadline. The real ones unless the deps give
 * another (bench:residency's replay runs the manager on a virtual clock, test/perf/residency-replay.ts).
 */
export interface ResidencyClock {
  now(): number
  mono(): number
  setTimeout(fn: () => void, ms: number): unknown
  clearTimeout(t: unknown): void
  timeout(ms: number): AbortSignal
}

export const REAL_CLOCK: ResidencyClock = {
  now: () => Date.now(),
  mono: () => performance.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (t) => clearTimeout(t as Timer),
  timeout: (ms) => AbortSignal.timeout(ms),
}
