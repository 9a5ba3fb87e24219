/**
 * InferenceKey: one inference API key as this pod holds it: its settings (what an operator set,
 * the same on every pod) and its windows (what requests entering this pod used: requests per
 * minute, tokens per minute, requests in flight, tokens in the budget's period). The windows are
 * plain numbers on the key, checked and moved without allocating anything.
 *
 * - Requests per minute: GCRA (the generic cell rate algorithm, a token bucket in one number): a
 *   key may send `rpm` requests at once, then one every 60/rpm s; `tat` is when the bucket would
 *   be full again.
 * - Tokens per minute: a bucket of `tpm` tokens refilled continuously.
 * - Budget: tokens in the current UTC day or month, refused once spent.
 *
 * The tokens of a request are known only when it ends (the engine's count), so a request reserves
 * its worst case when it begins (`reserve`: its prompt's estimate and its `max_tokens`, see
 * requestCost in src/wire/usage.ts), held against both the minute's bucket and the budget until it
 * ends, when the reservation is returned and the real count spent (`settle`). A request whose
 * reservation does not fit is refused (429), so requests in flight at once can never together pass
 * a limit: the most a key can spend past its budget, on one pod, is one request's excess (the only
 * reservation allowed to be larger than what is left: a request that begins when none of the key's
 * others is in flight), and past its tpm the excess of one request larger than the whole minute.
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

/**
 * KeyWindows: what the requests entering this pod used of one key (see the file comment). Made on
 * a key's first request, so a host holding many keys that are seldom used pays only for their settings.
 */
export class KeyWindows {
  /** GCRA's theoretical arrival time (Unix ms): when the request bucket is full again. */
  tat = 0
  /** Tokens left in the per-minute bucket, as of tokensAt (NaN: full, never used). */
  tokens = Number.NaN
  tokensAt = 0
  inFlight = 0
  /** Tokens reserved by this key's requests in flight here (each its worst case, until it ends). */
  reserved = 0
  /** The budget's current period [periodStart, periodEnd) and the tokens spent in it here. */
  periodStart = 0
  periodEnd = 0
  periodTokens = 0
  /** Tokens other pods reported spending in this period (cluster), by pod; null: none reported. */
  peers: Map<string, number> | null = null
  /** Their sum, counted against the budget with periodTokens. */
  peerTokens = 0
  /** This pod's periodTokens changed since it was last reported to the other pods. */
  unreported = false
}

/**
 * KeyLimits: a key's limits, immutable and shared by every key that has the same (keys come in
 * tiers: a host with 100,000 keys holds a handful of these, not 100,000). Name and expiry, which
 * differ from key to key, stay on the key.
 */
export interface KeyLimits {
  readonly models: ReadonlySet<string> | null
  readonly rpm: number | null
  readonly tpm: number | null
  readonly maxConcurrent: number | null
  readonly budgetTokens: number | null
  readonly budgetPeriod: BudgetPeriod | null
  readonly priority: Priority
}

/** The limits in use, by their settings (one object per distinct set). */
const interned = new Map<string, KeyLimits>()

function limitsOf(s: KeySettings): KeyLimits {
  const budgetPeriod = s.budget_tokens === null ? null : (s.budget_period ?? 'month')
  const id = JSON.stringify([
    s.models,
    s.rpm,
    s.tpm,
    s.max_concurrent,
    s.budget_tokens,
    budgetPeriod,
    s.priority,
  ])
  let l = interned.get(id)
  if (!l) {
    l = Object.freeze({
      models: s.models ? new Set(s.models) : null,
      rpm: s.rpm,
      tpm: s.tpm,
      maxConcurrent: s.max_concurrent,
      budgetTokens: s.budget_tokens,
      budgetPeriod,
      priority: s.priority,
    })
    interned.set(id, l)
  }
  return l
}

const NO_LIMITS = limitsOf({
  name: '',
  models: null,
  rpm: null,
  tpm: null,
  max_concurrent: null,
  budget_tokens: null,
  budget_period: null,
  priority: 'normal',
  expires_at: null,
})

export class InferenceKey {
  name = ''
  /** Unix ms; null: never expires. */
  expiresAt: number | null = null
  limits: KeyLimits = NO_LIMITS
  /** The second half of this key's index tag (KeyIndex). */
  tag = 0
  private w: KeyWindows | null = null

  constructor(readonly id: string) {}

  get models(): ReadonlySet<string> | null {
    return this.limits.models
  }
  get rpm(): number | null {
    return this.limits.rpm
  }
  get tpm(): number | null {
    return this.limits.tpm
  }
  get maxConcurrent(): number | null {
    return this.limits.maxConcurrent
  }
  get budgetTokens(): number | null {
    return this.limits.budgetTokens
  }
  get budgetPeriod(): BudgetPeriod | null {
    return this.limits.budgetPeriod
  }
  get priority(): Priority {
    return this.limits.priority
  }

  /** windows: this pod's windows of the key (made on first use). */
  get windows(): KeyWindows {
    this.w ??= new KeyWindows()
    return this.w
  }

  /** inFlight: requests of this key running on this pod. */
  get inFlight(): number {
    return this.w?.inFlight ?? 0
  }

  /** configure applies settings (a PATCH keeps the windows; a lower limit takes effect at once). */
  configure(s: KeySettings): void {
    const next = limitsOf(s)
    const w = this.w
    if (w && this.limits.tpm !== next.tpm) w.tokens = Number.NaN
    if (w && this.limits.budgetPeriod !== next.budgetPeriod) w.periodEnd = 0
    this.name = s.name
    this.expiresAt = s.expires_at
    this.limits = next
  }

  // ---- requests per minute (GCRA) ----

  /** requestWait: ms until a request may go (0: now), without taking it. */
  requestWait(now: number): number {
    const rpm = this.rpm
    if (rpm === null) return 0
    const next = Math.max(this.windows.tat, now) + MINUTE_MS / rpm
    return Math.max(0, next - now - MINUTE_MS)
  }

  /** takeRequest: a request goes now (call after requestWait said 0). */
  takeRequest(now: number): void {
    if (this.rpm === null) return
    const w = this.windows
    w.tat = Math.max(w.tat, now) + MINUTE_MS / this.rpm
  }

  /** giveBackRequest: a request taken was refused before any work (a model the key may not use): its place returns. */
  giveBackRequest(): void {
    if (this.rpm === null) return
    this.windows.tat -= MINUTE_MS / this.rpm
  }

  /** requestsLeft: requests that could go at once now. */
  requestsLeft(now: number): number {
    const rpm = this.rpm
    if (rpm === null) return 0
    return Math.max(0, Math.floor((MINUTE_MS - Math.max(0, this.windows.tat - now)) / (MINUTE_MS / rpm)))
  }

  /** requestsReset: ms until the request bucket is full again. */
  requestsReset(now: number): number {
    return Math.max(0, this.windows.tat - now)
  }

  // ---- tokens per minute ----

  /** tokensLeft: tokens in the bucket now (refilled to now; may be below zero). */
  tokensLeft(now: number): number {
    const tpm = this.tpm
    if (tpm === null) return Number.POSITIVE_INFINITY
    const w = this.windows
    if (Number.isNaN(w.tokens)) {
      w.tokens = tpm
      w.tokensAt = now
    } else if (now > w.tokensAt) {
      w.tokens = Math.min(tpm, w.tokens + ((now - w.tokensAt) * tpm) / MINUTE_MS)
      w.tokensAt = now
    }
    return w.tokens
  }

  /** tokensWait: ms until the token bucket holds a token again (0: it does). */
  tokensWait(now: number): number {
    if (this.tpm === null) return 0
    const left = this.tokensLeft(now)
    if (left > 0) return 0
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
    const w = this.w
    return w !== null && now >= w.periodStart && now < w.periodEnd
  }

  /** rollPeriod: the period containing `now` begins, with `spent` tokens already used in it. */
  rollPeriod(now: number, spent: number): void {
    const w = this.windows
    const [start, end] = periodOf(this.budgetPeriod ?? 'month', now)
    w.periodStart = start
    w.periodEnd = end
    w.periodTokens = spent
    w.peers = null
    w.peerTokens = 0
    w.unreported = spent > 0
  }

  /** peerSpent: `pod` reports it spent `tokens` of the current period (replacing what it said before). */
  peerSpent(pod: string, tokens: number): void {
    const w = this.windows
    w.peers ??= new Map()
    w.peers.set(pod, tokens)
    let sum = 0
    for (const n of w.peers.values()) sum += n
    w.peerTokens = sum
  }

  /** budgetSpent: the budget is set and used up in the current period (call after inPeriod/rollPeriod). */
  budgetSpent(): boolean {
    const w = this.windows
    return this.budgetTokens !== null && w.periodTokens + w.peerTokens >= this.budgetTokens
  }

  // ---- reservations (see the file comment) ----

  /**
   * reserve: a request that may use up to `worst` tokens begins: its reservation is held (true), or
   * why it does not fit: `tokens` (the minute's bucket, less what is reserved, holds less than the
   * request, or than the whole tpm for a request larger than it), `quota` (the budget is spent), or
   * `held` (what is left of the budget is reserved by requests in flight; it may free when they end).
   * Call after inPeriod/rollPeriod. A key with neither limit reserves nothing.
   */
  reserve(now: number, worst: number): true | 'tokens' | 'quota' | 'held' {
    const tpm = this.tpm
    const budget = this.budgetTokens
    if (tpm === null && budget === null) return true
    const w = this.windows
    if (tpm !== null && this.tokensLeft(now) - w.reserved < Math.min(worst, tpm)) return 'tokens'
    if (budget !== null) {
      const left = budget - w.periodTokens - w.peerTokens
      if (left <= 0) return 'quota'
      if (left - w.reserved < worst && !(w.reserved === 0 && left > 0)) return 'held'
      w.unreported = true
    }
    w.reserved += worst
    return true
  }

  /** tokensShortMs: ms until the minute's bucket, less what is reserved, holds `worst` (capped at tpm). */
  tokensShortMs(now: number, worst: number): number {
    const tpm = this.tpm
    if (tpm === null) return 0
    const short = Math.min(worst, tpm) - (this.tokensLeft(now) - this.windows.reserved)
    return short <= 0 ? 0 : Math.ceil((short * MINUTE_MS) / tpm)
  }

  /** settle: a request that reserved `reserved` ended: its reservation returns (spend its real count). */
  settle(reserved: number): void {
    if (reserved <= 0) return
    const w = this.windows
    w.reserved = Math.max(0, w.reserved - reserved)
    if (this.budgetTokens !== null) w.unreported = true
  }

  /** enter / leave: a request of this key begins or ends on this pod (its concurrency). */
  enter(): void {
    this.windows.inFlight++
  }

  leave(): void {
    this.windows.inFlight--
  }

  /** spend: a request that ended used `tokens`: the minute's bucket and the period's budget. */
  spend(now: number, tokens: number): void {
    if (tokens <= 0) return
    if (this.tpm !== null) {
      this.tokensLeft(now)
      this.windows.tokens -= tokens
    }
    if (this.budgetTokens !== null && this.inPeriod(now)) {
      const w = this.windows
      w.periodTokens += tokens
      w.unreported = true
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
