/**
 * residency-trace: the seeded request trace `npm run bench:residency` replays. Requests for N
 * models arrive as a Poisson process whose rate varies in time; each picks its model by Zipf
 * popularity (rank r has weight 1/r^s). Every `burstEverySeconds` a burst multiplies the rate for
 * `burstSeconds`, all of it for one model drawn from the less popular half (a team starting a job);
 * halfway through, the popularity order is reversed (the popular set shifts; `shift: false` keeps
 * it). Same seed, same trace.
 */
export interface TraceEvent {
  /** Simulated seconds from the start. */
  at: number
  model: string
}

export interface TraceOptions {
  seed: number
  models: readonly string[]
  minutes: number
  /** Requests per simulated second outside bursts. */
  ratePerSecond: number
  zipfS: number
  burstEverySeconds: number
  burstSeconds: number
  burstFactor: number
  /** Whether the popularity order is reversed halfway (default true). */
  shift?: boolean
}

export const DEFAULT_TRACE: Omit<TraceOptions, 'models'> = {
  seed: 20261127,
  minutes: 30,
  ratePerSecond: 0.5,
  zipfS: 1.1,
  burstEverySeconds: 240,
  burstSeconds: 30,
  burstFactor: 4,
}

/** mulberry32: a small seeded PRNG (uniform in [0, 1)). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

export function generateTrace(o: TraceOptions): TraceEvent[] {
  const rand = mulberry32(o.seed)
  const end = o.minutes * 60
  const half = end / 2
  const n = o.models.length
  const weights = Array.from({ length: n }, (_, r) => 1 / (r + 1) ** o.zipfS)
  const total = weights.reduce((a, b) => a + b, 0)
  const pick = (order: readonly string[]) => {
    let x = rand() * total
    for (let r = 0; r < n; r++) {
      x -= weights[r]!
      if (x <= 0) return order[r]!
    }
    return order[n - 1]!
  }
  const first = [...o.models]
  const second = o.shift === false ? first : [...o.models].reverse()
  const events: TraceEvent[] = []
  // Each burst window's model, from the less popular half of the order then in force.
  const burstModel = (window: number) => {
    const order = window * o.burstEverySeconds < half ? first : second
    const low = Math.floor(n / 2)
    return order[low + Math.floor(mulberry32(o.seed + 7919 * (window + 1))() * (n - low))]!
  }
  let t = 0
  // Thinning: candidates at the peak rate, each kept with the probability rate(t) / peak.
  const peak = o.ratePerSecond * o.burstFactor
  for (;;) {
    t += -Math.log(1 - rand()) / peak
    if (t >= end) break
    const window = Math.floor(t / o.burstEverySeconds)
    const inBurst = window > 0 && t - window * o.burstEverySeconds < o.burstSeconds
    const rate = inBurst ? peak : o.ratePerSecond
    if (rand() * peak > rate) continue
    const order = t < half ? first : second
    const model = inBurst && rand() < 1 - 1 / o.burstFactor ? burstModel(window) : pick(order)
    events.push({ at: t, model })
  }
  return events
}
