import { createHash, timingSafeEqual } from 'node:crypto'
import { MESSAGES_PATH } from './errors.ts'

/** credentials.ts: reading and comparing the secrets requests present (admin tokens, inference keys). */

function sha256(s: string): Buffer {
  return createHash('sha256').update(s).digest()
}

/** safeEqual compares secrets in constant time (hashing first so lengths do not leak). */
export function safeEqual(a: string, b: string): boolean {
  return timingSafeEqual(sha256(a), sha256(b))
}

const BEARER = /^Bearer\s+(.+)$/i

/**
 * inferenceAuthorization: the Authorization a request presents its inference key in. Anthropic's
 * clients send theirs as `x-api-key: <key>`, so on the Messages API (`/v1/messages`) that header
 * stands for `Authorization: Bearer <key>` when no Authorization is sent; elsewhere only
 * Authorization counts.
 */
export function inferenceAuthorization(head: {
  readonly path: string
  header(name: string): string | null
}): string | null {
  const given = head.header('authorization')
  if (given !== null || head.path !== MESSAGES_PATH) return given
  const key = head.header('x-api-key')
  return key === null ? null : `Bearer ${key.trim()}`
}

/**
 * bearerOf: the credential of an `Authorization: Bearer <credential>` value, or null. The common
 * spelling (`Bearer ` then the credential, nothing around) is read without a regular expression:
 * every inference request asks.
 */
export function bearerOf(h: string | null): string | null {
  if (!h) return null
  if (h.startsWith('Bearer ') && h.charCodeAt(7) > 32 && h.charCodeAt(h.length - 1) > 32) return h.slice(7)
  const m = BEARER.exec(h.trim())
  return m ? m[1]!.trim() : null
}
