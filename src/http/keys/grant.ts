import type { InferenceGrant } from '../../wire/route.ts'
import type { TokenUsage } from '../../wire/usage.ts'
import { type AppError, proxyError } from '../errors.ts'
import { duration, type InferenceKey, PRIORITY_RANK } from './key.ts'

/**
 * KeyGrant: one request's use of an inference key, from its head to its end (InferenceGrant): the
 * model it names must be one the key allows (403 `model_not_allowed`), it holds one of the key's
 * concurrent places and a reservation of its worst case in tokens (key.ts) from `begin` to `end`,
 * and its end is counted once (KeyEnds: usage, the minute's tokens, the budget, metrics). The
 * static INFERENCE_API_KEY's grant has no key: no limit, usage counted as `static`.
 *
 * A request that ends without beginning is counted under REFUSED_MODEL when refused before its
 * model was found, under `refusedModel(reason)` when refused for its key (its model list or
 * limits): usage rows are kept only for models that exist, whatever name a client sends.
 */
export interface KeyEnds {
  ended(key: InferenceKey | null, model: string, status: number, usage: TokenUsage | null): void
  refused(key: InferenceKey, reason: RefusalReason): void
}

export type RefusalReason = 'requests' | 'tokens' | 'concurrency' | 'quota' | 'model'

/** REFUSED_MODEL: the one usage label of requests refused before a model served them. */
export const REFUSED_MODEL = '(refused)'

/**
 * refusedModel: the usage label of requests refused for their key, by reason (`(refused: requests)`
 * for rpm, `tokens` for tpm, `concurrency`, `quota` for the budget, `model` for one it may not use):
 * a fixed few labels, never a name a client sends.
 */
export function refusedModel(reason: RefusalReason): string {
  return `${REFUSED_MODEL.slice(0, -1)}: ${reason})`
}

export class KeyGrant implements InferenceGrant {
  private model: string | null = null
  private reserved = 0
  private over = false
  /** refusal: why begin refused the request for its key (its usage label), or null. */
  private refusal: RefusalReason | null = null

  constructor(
    private readonly ends: KeyEnds,
    private readonly key: InferenceKey | null,
    /** responseHead: the key's `x-ratelimit-*` lines, told again when a refusal gives its request back. */
    public responseHead: string,
  ) {}

  get priority(): number {
    return this.key ? PRIORITY_RANK[this.key.priority] : PRIORITY_RANK.normal
  }

  get metered(): boolean {
    const key = this.key
    return key !== null && (key.tpm !== null || key.budgetTokens !== null)
  }

  /** party: the key itself, whose id and max_concurrent a held queue reads (null: the static key). */
  get party(): InferenceKey | null {
    return this.key
  }

  begin(model: string, worst: number, now = Date.now()): AppError | null {
    if (this.model !== null || this.over) return null
    const key = this.key
    if (key) {
      if (key.models !== null && !key.models.has(model)) {
        // Refused before any work: the request does not use up one of the key's requests per minute.
        key.giveBackRequest()
        this.responseHead = rateLimitHead(key, now)
        this.refusal = 'model'
        this.ends.refused(key, 'model')
        return modelNotAllowed(key, model)
      }
      if (key.maxConcurrent !== null && key.inFlight >= key.maxConcurrent) {
        this.refusal = 'concurrency'
        this.ends.refused(key, 'concurrency')
        return tooManyConcurrent(key, {})
      }
      const fits = key.reserve(now, worst)
      if (fits !== true) {
        this.refusal = fits === 'tokens' ? 'tokens' : 'quota'
        this.ends.refused(key, this.refusal)
        const headers = rateLimitHeaders(key, now)
        if (fits === 'tokens') return tooManyTokens(key, key.tokensShortMs(now, worst), headers, worst)
        return fits === 'quota' ? quotaSpent(key, headers) : budgetHeld(key, worst, headers)
      }
      this.reserved = worst
      key.enter()
    }
    this.model = model
    return null
  }

  lists(model: string): boolean {
    const key = this.key
    return !key || key.models === null || key.models.has(model)
  }

  allows(model: string): AppError | null {
    const key = this.key
    if (!key || this.lists(model)) return null
    this.ends.refused(key, 'model')
    return modelNotAllowed(key, model)
  }

  end(status: number, usage: TokenUsage | null): void {
    if (this.over) return
    this.over = true
    const model = this.model
    if (model === null) {
      this.ends.ended(this.key, this.refusal ? refusedModel(this.refusal) : REFUSED_MODEL, status, null)
      return
    }
    this.model = null
    const key = this.key
    if (key) {
      key.settle(this.reserved)
      key.leave()
    }
    this.ends.ended(key, model, status, usage)
  }
}

/** rateLimitHead: the `x-ratelimit-*` lines of a key at `now` (none for a limit it does not have). */
export function rateLimitHead(key: InferenceKey, now: number): string {
  let head = ''
  if (key.rpm !== null)
    head +=
      `x-ratelimit-limit-requests: ${key.rpm}\r\n` +
      `x-ratelimit-remaining-requests: ${key.requestsLeft(now)}\r\n` +
      `x-ratelimit-reset-requests: ${duration(key.requestsReset(now))}\r\n`
  if (key.tpm !== null)
    head +=
      `x-ratelimit-limit-tokens: ${key.tpm}\r\n` +
      `x-ratelimit-remaining-tokens: ${Math.max(0, Math.floor(key.tokensLeft(now)))}\r\n` +
      `x-ratelimit-reset-tokens: ${duration(key.tokensReset(now))}\r\n`
  return head
}

/** rateLimitHeaders: the same as headers of a refusal (an AppError's). */
export function rateLimitHeaders(key: InferenceKey, now: number): Record<string, string> {
  const out: Record<string, string> = {}
  for (const line of rateLimitHead(key, now).split('\r\n')) {
    const colon = line.indexOf(': ')
    if (colon > 0) out[line.slice(0, colon)] = line.slice(colon + 2)
  }
  return out
}

// ---- refusals, in OpenAI's words and codes, so that its clients react as they do with OpenAI ----

const seconds = (ms: number) => Math.max(1, Math.ceil(ms / 1000))

export function missingKey(): AppError {
  return proxyError(
    401,
    'authentication_error',
    'missing_api_key',
    'Missing API key: send Authorization: Bearer <API_KEY>',
  )
}

/** invalidKey: unknown, revoked or expired alike (the answer tells no more than that). */
export function invalidKey(): AppError {
  return proxyError(401, 'authentication_error', 'invalid_api_key', 'Invalid API key')
}

export function tooManyRequests(
  key: InferenceKey,
  waitMs: number,
  headers: Record<string, string>,
): AppError {
  const s = seconds(waitMs)
  return proxyError(
    429,
    'requests',
    'rate_limit_exceeded',
    `Rate limit reached for key '${key.name}' on requests per min (RPM): Limit ${key.rpm}. Please try again in ${s}s.`,
    undefined,
    { ...headers, 'retry-after': String(s) },
  )
}

export function tooManyTokens(
  key: InferenceKey,
  waitMs: number,
  headers: Record<string, string>,
  requested?: number,
): AppError {
  const s = seconds(waitMs)
  const asked = requested === undefined ? '' : `, Requested ${requested}`
  return proxyError(
    429,
    'tokens',
    'rate_limit_exceeded',
    `Rate limit reached for key '${key.name}' on tokens per min (TPM): Limit ${key.tpm}${asked}. Please try again in ${s}s.`,
    undefined,
    { ...headers, 'retry-after': String(s) },
  )
}

/** A concurrent place frees when a request ends: a client may retry soon. */
const CONCURRENCY_RETRY_SECONDS = 1

export function tooManyConcurrent(key: InferenceKey, headers: Record<string, string>): AppError {
  return proxyError(
    429,
    'requests',
    'rate_limit_exceeded',
    `Rate limit reached for key '${key.name}' on concurrent requests: Limit ${key.maxConcurrent}. Please try again in ${CONCURRENCY_RETRY_SECONDS}s.`,
    undefined,
    { ...headers, 'retry-after': String(CONCURRENCY_RETRY_SECONDS) },
  )
}

/**
 * quotaSpent: OpenAI's 429 `insufficient_quota`, with `x-should-retry: false` (what OpenAI's own
 * clients read to stop retrying): waiting seconds does not help, the budget renews with its period.
 */
export function quotaSpent(key: InferenceKey, headers: Record<string, string>): AppError {
  return proxyError(
    429,
    'insufficient_quota',
    'insufficient_quota',
    `Key '${key.name}' has used its budget of ${key.budgetTokens} tokens for this ${key.budgetPeriod} (UTC); ` +
      `it renews at ${new Date(key.windows.periodEnd).toISOString()}.`,
    undefined,
    { ...headers, 'x-should-retry': 'false' },
  )
}

/** A reservation returns when a request ends: a client may retry soon. */
const HELD_RETRY_SECONDS = 1

/**
 * budgetHeld: what is left of the budget is reserved by the key's requests in flight (each holds its
 * worst case until it ends, when the unused part returns): a retry may fit, unlike insufficient_quota.
 */
export function budgetHeld(key: InferenceKey, requested: number, headers: Record<string, string>): AppError {
  return proxyError(
    429,
    'tokens',
    'rate_limit_exceeded',
    `Key '${key.name}' has too little of its budget of ${key.budgetTokens} tokens left unreserved for this request ` +
      `(Requested ${requested}: its prompt and max_tokens); requests in flight hold the rest. Please try again in ${HELD_RETRY_SECONDS}s.`,
    undefined,
    { ...headers, 'retry-after': String(HELD_RETRY_SECONDS) },
  )
}

export function modelNotAllowed(key: InferenceKey, model: string): AppError {
  return proxyError(
    403,
    'invalid_request_error',
    'model_not_allowed',
    `Key '${key.name}' may not use model '${model}'`,
    'model',
  )
}
