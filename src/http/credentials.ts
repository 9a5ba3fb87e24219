import { createHash, timingSafeEqual } from 'node:crypto'

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
