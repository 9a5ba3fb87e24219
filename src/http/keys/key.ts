/**
 * InferenceKey: one inference API key as this pod holds it: its settings (what an operator set,
 * the same on every pod) and its windows (what requests entering this pod used: requests per
 * minute, tokens per minute, requests in flight, tokens in the budget's period). The windows are
 * plain numbers on the key, checked and moved without allocating anything.
 *
 * - Requests per minute: GCRA (the generic cell rate algorithm, a token bucket in one number): a
 *   key may send `rpm` requests at once, then one every 60/rpm s; `tat` is when the bucket would
 *   be full again.
 * - Tokens per minute: a bucket of `tpm` tokens refilled continuously. The tokens of a request are
 *   known only when it ends (the engine's count), so a request is refused while the bucket is
 *   empty, and the one that empties it may take it below zero: the next ones wait until it refills.
 * - Budget: tokens in the current UTC day or month, refused once spent (the stream that spends the
 *   last of it finishes; the next request is refused).
 */
export type Priority = 'high' | 'normal' | 'low'
export type BudgetPeriod = 'day' | 'month'

/** PRIORITY_RANK: a priority as the directory's queues order it (lower goes first). */
export const PRIORITY_RANK: Readonly<Record<Priority, number>> = { high: 0, normal: 1, low: 2 }

/** KeySettings: what an operator sets on a key (null: no limit; models null: every model). */
export interface KeySettings {
  name: string
  models: string[] | null
  rpm: number | null
  tpm: number | null
  max_concurrent: number | null
  budget_tokens: number | null
  budget_period: BudgetPeriod | null
  priority: Priority
  /** Unix ms; null: never expires. */
  expires_at: number | null
}

/** KeyRecord: a key as stored and as pods send it to each other (its secret's digest, never the secret). */
export interface KeyRecord extends KeySettings {
  id: string
  /** SHA-256 (hex) of the secret. */
  digest: string
  created_at: number
  /** Unix ms of the last change: the newer record wins across pods. */
  version: number
  /** Unix ms; set once revoked (a tombstone, kept so the revocation reaches every pod). */
  revoked_at: number | null
}

const MINUTE_MS = 60_000
const DAY_MS = 86_400_000

export class InferenceKey {
  name = ''
  models: ReadonlySet<string> | null = null
  rpm: number | null = null
  tpm: number | null = null
  maxConcurrent: number | null = null
  budgetTokens: number | null = null
  budgetPeriod: BudgetPeriod | null = null
  priority: Priority = 'normal'
  expiresAt: number | null = null

  // The windows of this pod.
  /** GCRA's theoretical arrival time (Unix ms): when the request bucket is full again. */
  tat = 0
  /** Tokens left in the per-minute bucket, as of tokensAt (NaN: full, never used). */
  tokens = Number.NaN
  tokensAt = 0
  inFlight = 0
  /** The budget's current period [periodStart, periodEnd) and the tokens spent in it. */
  periodStart = 0
  periodEnd = 0
  periodTokens = 0
  /** Tokens other pods reported spending in this period (cluster), by pod; null: none reported. */
  private peers: Map<string, number> | null = null
  /** Their sum, counted against the budget with periodTokens. */
  peerTokens = 0
  /** This pod's periodTokens changed since it was last reported to the other pods. */
  unreported = false

  constructor(readonly id: string) {}

  /** configure applies settings (a PATCH keeps the windows; a lower limit takes effect at once). */
  configure(s: KeySettings): void {
    this.name = s.name
    this.models = s.models ? new Set(s.models) : null
    this.rpm = s.rpm
    if (this.tpm !== s.tpm) this.tokens = Number.NaN
    this.tpm = s.tpm
    this.maxConcurrent = s.max_concurrent
    if (this.budgetPeriod !== (s.budget_tokens === null ? null : s.budget_period)) this.periodEnd = 0
    this.budgetTokens = s.budget_tokens
    this.budgetPeriod = s.budget_tokens === null ? null : (s.budget_period ?? 'month')
    this.priority = s.priority
    this.expiresAt = s.expires_at
  }

  // ---- requests per minute (GCRA) ----

  /** requestWait: ms until a request may go (0: now), without taking it. */
  requestWait(now: number): number {
    const rpm = this.rpm
    if (rpm === null) return 0
    const next = Math.max(this.tat, now) + MINUTE_MS / rpm
    return Math.max(0, next - now - MINUTE_MS)
  }

  /** takeRequest: a request goes now (call after requestWait said 0). */
  takeRequest(now: number): void {
    if (this.rpm !== null) this.tat = Math.max(this.tat, now) + MINUTE_MS / this.rpm
  }

  /** requestsLeft: requests that could go at once now. */
  requestsLeft(now: number): number {
    const rpm = this.rpm
    if (rpm === null) return 0
    return Math.max(0, Math.floor((MINUTE_MS - Math.max(0, this.tat - now)) / (MINUTE_MS / rpm)))
  }

  /** requestsReset: ms until the request bucket is full again. */
  requestsReset(now: number): number {
    return Math.max(0, this.tat - now)
  }

  // ---- tokens per minute ----

  /** tokensLeft: tokens in the bucket now (refilled to now; may be below zero). */
  tokensLeft(now: number): number {
    const tpm = this.tpm
    if (tpm === null) return Number.POSITIVE_INFINITY
    if (Number.isNaN(this.tokens)) {
      this.tokens = tpm
      this.tokensAt = now
    } else if (now > this.tokensAt) {
      this.tokens = Math.min(tpm, this.tokens + ((now - this.tokensAt) * tpm) / MINUTE_MS)
      this.tokensAt = now
    }
    return this.tokens
  }

  /** tokensWait: ms until the token bucket holds a token again (0: it does). */
  tokensWait(now: number): number {
    const left = this.tokensLeft(now)
    if (left > 0 || this.tpm === null) return 0
    return Math.ceil(((1 - left) * MINUTE_MS) / this.tpm)
  }

  /** tokensReset: ms until the token bucket is full again. */
  tokensReset(now: number): number {
    const tpm = this.tpm
    if (tpm === null) return 0
    return Math.ceil(((tpm - this.tokensLeft(now)) * MINUTE_MS) / tpm)
  }

  // ---- budget ----

  /** inPeriod: whether the budget's period is the current one (else it must be rolled over: rollPeriod). */
  inPeriod(now: number): boolean {
    return now >= this.periodStart && now < this.periodEnd
  }

  /** rollPeriod: the period containing `now` begins, with `spent` tokens already used in it. */
  rollPeriod(now: number, spent: number): void {
    const [start, end] = periodOf(this.budgetPeriod ?? 'month', now)
    this.periodStart = start
    this.periodEnd = end
    this.periodTokens = spent
    this.peers = null
    this.peerTokens = 0
    this.unreported = spent > 0
  }

  /** peerSpent: `pod` reports it spent `tokens` of the current period (replacing what it said before). */
  peerSpent(pod: string, tokens: number): void {
    this.peers ??= new Map()
    this.peers.set(pod, tokens)
    let sum = 0
    for (const n of this.peers.values()) sum += n
    this.peerTokens = sum
  }

  /** budgetSpent: the budget is set and used up in the current period (call after inPeriod/rollPeriod). */
  budgetSpent(): boolean {
    return this.budgetTokens !== null && this.periodTokens + this.peerTokens >= this.budgetTokens
  }

  /** spend: a request that ended used `tokens`: the minute's bucket and the period's budget. */
  spend(now: number, tokens: number): void {
    if (tokens <= 0) return
    if (this.tpm !== null) {
      this.tokensLeft(now)
      this.tokens -= tokens
    }
    if (this.budgetTokens !== null && this.inPeriod(now)) {
      this.periodTokens += tokens
      this.unreported = true
    }
  }
}

/** periodOf: [start, end) in Unix ms of the UTC day or month containing `now`. */
export function periodOf(period: BudgetPeriod, now: number): [number, number] {
  if (period === 'day') {
    const start = Math.floor(now / DAY_MS) * DAY_MS
    return [start, start + DAY_MS]
  }
  const d = new Date(now)
  const y = d.getUTCFullYear()
  const m = d.getUTCMonth()
  return [Date.UTC(y, m, 1), Date.UTC(y, m + 1, 1)]
}

/** duration: ms in OpenAI's rate-limit reset format (`250ms`, `12s`, `6m0s`). */
export function duration(ms: number): string {
  if (ms < 1000) return `${Math.max(0, Math.ceil(ms))}ms`
  const s = Math.ceil(ms / 1000)
  if (s < 60) return `${s}s`
  return `${Math.floor(s / 60)}m${s % 60}s`
}
