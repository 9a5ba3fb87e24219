import type { InferenceGrant } from '../../wire/route.ts'
import type { TokenUsage } from '../../wire/usage.ts'
import { type AppError, proxyError } from '../errors.ts'
import { duration, type InferenceKey, PRIORITY_RANK } from './key.ts'

/**
 * KeyGrant: one request's use of an inference key, from its head to its end (InferenceGrant): the
 * model it names must be one the key allows (403 `model_not_allowed`), it holds one of the key's
 * concurrent places from `begin` to `end`, and its end is counted once (KeyEnds: usage, the
 * minute's tokens, the budget, metrics). The static INFERENCE_API_KEY's grant has no key: no
 * limit, usage counted as `static`.
 */
export interface KeyEnds {
  ended(key: InferenceKey | null, model: string, status: number, usage: TokenUsage | null): void
  refused(key: InferenceKey, reason: RefusalReason): void
}

export type RefusalReason = 'requests' | 'tokens' | 'concurrency' | 'quota' | 'model'

export class KeyGrant implements InferenceGrant {
  private model: string | null = null

  constructor(
    private readonly ends: KeyEnds,
    private readonly key: InferenceKey | null,
    readonly responseHead: string,
  ) {}

  get priority(): number {
    return this.key ? PRIORITY_RANK[this.key.priority] : PRIORITY_RANK.normal
  }

  /** party: the key itself, whose id and max_concurrent a held queue reads (null: the static key). */
  get party(): InferenceKey | null {
    return this.key
  }

  begin(model: string): AppError | null {
    if (this.model !== null) return null
    const key = this.key
    if (key) {
      if (key.models !== null && !key.models.has(model)) {
        this.ends.refused(key, 'model')
        return modelNotAllowed(key, model)
      }
      if (key.maxConcurrent !== null && key.inFlight >= key.maxConcurrent) {
        this.ends.refused(key, 'concurrency')
        return tooManyConcurrent(key, {})
      }
      key.enter()
    }
    this.model = model
    return null
  }

  end(status: number, usage: TokenUsage | null): void {
    const model = this.model
    if (model === null) return
    this.model = null
    this.key?.leave()
    this.ends.ended(this.key, model, status, usage)
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

export function tooManyTokens(key: InferenceKey, waitMs: number, headers: Record<string, string>): AppError {
  const s = seconds(waitMs)
  return proxyError(
    429,
    'tokens',
    'rate_limit_exceeded',
    `Rate limit reached for key '${key.name}' on tokens per min (TPM): Limit ${key.tpm}. Please try again in ${s}s.`,
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

export function modelNotAllowed(key: InferenceKey, model: string): AppError {
  return proxyError(
    403,
    'invalid_request_error',
    'model_not_allowed',
    `Key '${key.name}' may not use model '${model}'`,
    'model',
  )
}
