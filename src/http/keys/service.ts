import { randomBytes } from 'node:crypto'
import type { Registry } from 'prom-client'
import type { EventBus } from '../../host/bus.ts'
import type { Store } from '../../store/db.ts'
import type { TokenUsage } from '../../wire/usage.ts'
import { bearerOf, safeEqual } from '../credentials.ts'
import { type AppError, badRequest, notFound } from '../errors.ts'
import { KeyBook, type KeyChange } from './book.ts'
import {
  invalidKey,
  type KeyEnds,
  KeyGrant,
  missingKey,
  quotaSpent,
  type RefusalReason,
  rateLimitHead,
  rateLimitHeaders,
  refusedModel,
  tooManyConcurrent,
  tooManyRequests,
  tooManyTokens,
} from './grant.ts'
import { type InferenceKey, type KeyRecord, type KeySettings, periodOf } from './key.ts'
import { KeyMetrics } from './metrics.ts'
import { STATIC_KEY_ID, UsageBook } from './usage-book.ts'

/**
 * InferenceKeys: per-key governance of inference in modelgate itself (the core's: the router runs
 * without the gateway). Keys are an admin resource (routes.ts); every listener's front asks `admit`
 * from a request's head, before its body is read:
 *
 * - no key needed (no INFERENCE_API_KEY and no key ever created): null, inference is open;
 * - no key given: 401 `missing_api_key`; a key nobody has, revoked or expired: 401 `invalid_api_key`;
 * - the static INFERENCE_API_KEY: an unlimited grant (usage counted as `static`);
 * - a key whose budget is spent: 429 `insufficient_quota`; whose requests or tokens per minute or
 *   concurrent requests are at their limit: 429 `rate_limit_exceeded` with Retry-After;
 * - else a grant (grant.ts) carrying the key's `x-ratelimit-*` lines for every answer.
 *
 * Once one key has been created inference needs a key, and revoking every key does not open it
 * again. The windows are this pod's (key.ts): a cluster's pods each hold a key to its limits for
 * the requests that enter them. Usage is the engine's own count (src/wire/usage.ts), per key, model
 * and hour (usage-book.ts); budgets read it.
 */
export interface KeyInput {
  name: string
  models?: string[] | null
  rpm?: number | null
  tpm?: number | null
  max_concurrent?: number | null
  budget_tokens?: number | null
  budget_period?: 'day' | 'month' | null
  priority?: 'high' | 'normal' | 'low'
  expires_at?: string | null
}

/** KeyView: a key as the admin API shows it (never its secret nor its digest). */
export interface KeyView {
  id: string
  name: string
  models: string[] | null
  rpm: number | null
  tpm: number | null
  max_concurrent: number | null
  budget_tokens: number | null
  budget_period: 'day' | 'month' | null
  priority: 'high' | 'normal' | 'low'
  expires_at: string | null
  created_at: string
  updated_at: string
}

/** KeyState: what this pod's windows hold of a key now. */
export interface KeyState {
  in_flight: number
  budget_used: number | null
  budget_period_end: string | null
}

/** KeySpend: what one pod spent of a key's budget period (Unix ms of its start), for the others. */
export interface KeySpend {
  id: string
  period_start: number
  tokens: number
}

/** Where key changes come from: this pod's admin API, or another pod (cluster plugin). */
export type KeyOrigin = 'local' | 'peer'

declare module '../../host/bus.ts' {
  interface BusEvents {
    /** keys.changed: keys created, changed or revoked, by id and name (never a secret or digest). */
    'keys.changed': { origin: KeyOrigin; keys: { id: string; name: string; change: KeyChange }[] }
  }
}

export class InferenceKeys implements KeyEnds {
  readonly book = new KeyBook()
  readonly usage = new UsageBook()
  private metrics: KeyMetrics | null = null
  private bus: EventBus | null = null

  constructor(
    /** The static INFERENCE_API_KEY (null: none). */
    private readonly staticKey: string | null,
  ) {}

  /**
   * attach loads the keys from `store`, starts writing usage to it (a write that fails is kept for
   * the next and told to `failed`), and announces changes on `bus`.
   */
  attach(store: Store, bus: EventBus, failed: (err: unknown) => void): void {
    this.bus = bus
    this.book.attach(store)
    this.usage.attach(store, failed)
  }

  useMetrics(registry: Registry): void {
    this.metrics = new KeyMetrics(registry, () => this.book.size)
  }

  /** stop writes the usage still pending (the store closes next). */
  stop(): void {
    this.usage.stop()
  }

  /**
   * consoleKey: the key the dashboard's chat and proxy benchmarks send while inference needs a key and
   * no static one is set (keys made through the API, or every key since deleted: inference stays
   * closed). Made at start-up, held in memory only, never stored nor logged; it is judged as the
   * static key is (no limits, usage under `static`). Only an admin's session is given it, and an
   * admin may make any key anyway: it grants nothing an admin lacks. A new one each start.
   */
  private readonly consoleKey = `mg-console-${randomBytes(24).toString('base64url')}`

  /** required: inference needs a key (the static one is set, or a key was ever created). */
  get required(): boolean {
    return this.staticKey !== null || this.book.everCreated
  }

  /** ownKey: the key this process's own clients send (the dashboard, proxy benchmarks); null: inference is open. */
  ownKey(): string | null {
    if (!this.required) return null
    return this.staticKey ?? this.consoleKey
  }

  /**
   * admit judges a request's key from its head (see the class comment). `final` false: a refusal
   * may yet be overruled (the router's head, before it knows whether the model needs a key at all),
   * so it is counted (metric and usage) only by the judgement that stands.
   */
  admit(authorization: string | null, now = Date.now(), final = true): AppError | KeyGrant | null {
    if (!this.required) return null
    const given = bearerOf(authorization)
    if (given === null) return missingKey()
    if (this.staticKey !== null && safeEqual(given, this.staticKey)) return new KeyGrant(this, null, '')
    if (safeEqual(given, this.consoleKey)) return new KeyGrant(this, null, '')
    const key = this.book.find(given)
    if (key === undefined || (key.expiresAt !== null && key.expiresAt <= now)) {
      this.metrics?.refused('unknown', 'invalid_key')
      return invalidKey()
    }
    if (key.budgetTokens !== null) {
      if (!key.inPeriod(now)) {
        const [start] = periodOf(key.budgetPeriod ?? 'month', now)
        key.rollPeriod(now, this.usage.tokensSince(key.id, start))
      }
      if (key.budgetSpent())
        return this.refuse(key, 'quota', quotaSpent(key, rateLimitHeaders(key, now)), now, final)
    }
    if (key.maxConcurrent !== null && key.inFlight >= key.maxConcurrent)
      return this.refuse(key, 'concurrency', tooManyConcurrent(key, rateLimitHeaders(key, now)), now, final)
    const wait = key.requestWait(now)
    if (wait > 0)
      return this.refuse(key, 'requests', tooManyRequests(key, wait, rateLimitHeaders(key, now)), now, final)
    const tokenWait = key.tokensWait(now)
    if (tokenWait > 0)
      return this.refuse(key, 'tokens', tooManyTokens(key, tokenWait, rateLimitHeaders(key, now)), now, final)
    key.takeRequest(now)
    return new KeyGrant(this, key, rateLimitHead(key, now))
  }

  /**
   * refuse: a refusal from the head alone (rpm, tpm, concurrency, a spent budget). No grant ends
   * it, so its usage is counted here: an error under `refusedModel(reason)`, added in memory as a
   * served request's is and written with the next batch.
   */
  private refuse(
    key: InferenceKey,
    reason: RefusalReason,
    error: AppError,
    now: number,
    final: boolean,
  ): AppError {
    if (!final) return error
    this.refused(key, reason)
    this.usage.add(key.id, refusedModel(reason), now, true, 0, 0)
    return error
  }

  // ---- KeyEnds: what a grant reports ----

  ended(key: InferenceKey | null, model: string, status: number, usage: TokenUsage | null): void {
    const now = Date.now()
    const prompt = usage?.prompt ?? 0
    const completion = usage?.completion ?? 0
    const error = status >= 400
    this.usage.add(key?.id ?? STATIC_KEY_ID, model, now, error, prompt, completion)
    key?.spend(now, prompt + completion)
    this.metrics?.ended(key?.name ?? STATIC_KEY_ID, error, prompt, completion)
  }

  refused(key: InferenceKey, reason: RefusalReason): void {
    this.metrics?.refused(key.name, reason)
  }

  // ---- the admin API ----

  /** create: a new key; its secret is returned here and nowhere else, ever. */
  create(input: KeyInput): KeyView & { key: string } {
    const { record, secret } = this.book.create(settingsOf(input))
    this.announce('local', [{ record, change: 'created' }])
    return { ...viewOf(record), key: secret }
  }

  list(offset: number, limit: number): { keys: KeyView[]; total: number } {
    return { keys: this.book.page(offset, limit).map(viewOf), total: this.book.size }
  }

  /** detail: a live key with this pod's windows; 404 for an unknown or revoked one. */
  detail(id: string): KeyView & { state: KeyState } {
    const record = this.book.record(id)
    const key = this.book.get(id)
    if (!record || !key) throw keyNotFound(id)
    const budget = key.budgetTokens !== null
    const now = Date.now()
    const w = key.windows
    return {
      ...viewOf(record),
      state: {
        in_flight: key.inFlight,
        budget_used: budget ? (key.inPeriod(now) ? w.periodTokens + w.peerTokens : 0) : null,
        budget_period_end: budget && key.inPeriod(now) ? new Date(w.periodEnd).toISOString() : null,
      },
    }
  }

  /** known: `id` when a key of that id exists or was revoked (its usage stays readable); else 404. */
  known(id: string): string {
    if (id === STATIC_KEY_ID || this.book.record(id)) return id
    throw keyNotFound(id)
  }

  /** update: a PATCH (absent: unchanged; null: no limit); 404 for an unknown or revoked key. */
  update(id: string, patch: Partial<KeyInput>): KeyView {
    const old = this.book.record(id)
    if (!old || old.revoked_at !== null) throw keyNotFound(id)
    const record = this.book.update(id, settingsOf({ ...inputOf(old), ...patch }))
    if (!record) throw keyNotFound(id)
    this.announce('local', [{ record, change: 'updated' }])
    return viewOf(record)
  }

  /** revoke: refused from the next request on (a running one finishes); 404 for an unknown or revoked key. */
  revoke(id: string): { id: string; revoked: true } {
    const record = this.book.revoke(id)
    if (!record) throw keyNotFound(id)
    this.announce('local', [{ record, change: 'revoked' }])
    return { id, revoked: true }
  }

  // ---- the cluster ----

  /** records: every stored key record (tombstones included) for another pod; `ids` to send only those. */
  records(ids?: readonly string[]): KeyRecord[] {
    if (!ids) return this.book.records()
    return ids.map((id) => this.book.record(id)).filter((r): r is KeyRecord => r !== undefined)
  }

  /** merge takes another pod's records (newer ones win, tombstones stay); returns how many changed. */
  merge(records: readonly KeyRecord[]): number {
    const changed = this.book.merge(records)
    if (changed.length > 0) this.announce('peer', changed)
    return changed.length
  }

  /**
   * spends: what this pod spent of each budgeted key's current period, for the other pods (a
   * cluster's budget holds across its pods): the keys that changed since the last call, or all
   * (`all`: for a pod that joined, and now and then for one that missed a report).
   */
  spends(all: boolean, now = Date.now()): KeySpend[] {
    const out: KeySpend[] = []
    for (const key of this.book.live()) {
      if (key.budgetTokens === null || !key.inPeriod(now)) continue
      const w = key.windows
      // What is reserved here counts too: requests in flight on this pod hold it from the others.
      const tokens = w.periodTokens + w.reserved
      if (!(all ? tokens > 0 : w.unreported)) continue
      w.unreported = false
      out.push({ id: key.id, period_start: w.periodStart, tokens })
    }
    return out
  }

  /** peerSpent: another pod's spends (see spends); one of another period than this pod's is ignored. */
  peerSpent(pod: string, spends: readonly KeySpend[], now = Date.now()): void {
    for (const s of spends) {
      const key = this.book.get(s.id)
      if (!key || key.budgetTokens === null) continue
      if (!key.inPeriod(now)) {
        const [start] = periodOf(key.budgetPeriod ?? 'month', now)
        key.rollPeriod(now, this.usage.tokensSince(key.id, start))
      }
      if (key.windows.periodStart === s.period_start) key.peerSpent(pod, s.tokens)
    }
  }

  private announce(origin: KeyOrigin, changes: { record: KeyRecord; change: KeyChange }[]): void {
    this.bus?.emit('keys.changed', {
      origin,
      keys: changes.map(({ record, change }) => ({ id: record.id, name: record.name, change })),
    })
  }
}

function keyNotFound(id: string): AppError {
  return notFound(`No inference key with id '${id}'`, 'KEY_NOT_FOUND')
}

const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString())

function viewOf(r: KeyRecord): KeyView {
  return {
    id: r.id,
    name: r.name,
    models: r.models,
    rpm: r.rpm,
    tpm: r.tpm,
    max_concurrent: r.max_concurrent,
    budget_tokens: r.budget_tokens,
    budget_period: r.budget_period,
    priority: r.priority,
    expires_at: iso(r.expires_at),
    created_at: iso(r.created_at)!,
    updated_at: iso(r.version)!,
  }
}

/** inputOf: a stored record as the input it came from (what a PATCH is laid over). */
function inputOf(r: KeyRecord): KeyInput {
  return { ...r, expires_at: iso(r.expires_at) }
}

/** settingsOf: validated settings from an input (the schema checked types and bounds; this, what they cannot). */
function settingsOf(input: KeyInput): KeySettings {
  let expires: number | null = null
  if (input.expires_at !== undefined && input.expires_at !== null) {
    expires = Date.parse(input.expires_at)
    if (!Number.isFinite(expires))
      throw badRequest('body.expires_at: must be a date-time such as 2027-01-31T00:00:00Z')
  }
  const name = input.name.trim()
  if (name === '') throw badRequest('body.name: must not be blank')
  const budget = input.budget_tokens ?? null
  return {
    name,
    models: input.models ? [...new Set(input.models)] : null,
    rpm: input.rpm ?? null,
    tpm: input.tpm ?? null,
    max_concurrent: input.max_concurrent ?? null,
    budget_tokens: budget,
    budget_period: budget === null ? null : (input.budget_period ?? 'month'),
    priority: input.priority ?? 'normal',
    expires_at: expires,
  }
}
