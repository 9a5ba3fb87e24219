/**
 * Header rules of the pass-through proxy (RFC 9110 §7.6.1): hop-by-hop headers belong to one
 * connection and are never forwarded, in either direction; everything else passes unchanged.
 * The exchange skips them while writing the request and while reading the response (no Headers
 * copies).
 */
export const HOP_BY_HOP = [
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'proxy-authenticate',
  'proxy-authorization',
] as const

/**
 * PEER_HEADER carries the client's address from the listener's front to the framework behind it
 * (which sees only a Unix socket): the front sets it and never forwards a client's own copy.
 */
export const PEER_HEADER = 'x-modelgate-peer'

/**
 * INTERNAL_HEADER tells the framework that the front verified a relayed `/internal/*` request's
 * cluster signature: its value is the AuthService's per-process token (src/http/auth.ts
 * vetInternal). Only the front sets it; a client's copy is never forwarded.
 */
export const INTERNAL_HEADER = 'x-modelgate-internal'

/**
 * Not sent upstream: hop-by-hop headers, `host` (the upstream's is sent), `content-length` and
 * `expect` (the client frames the forwarded body itself), PEER_HEADER and INTERNAL_HEADER (only
 * the front sets them).
 */
export const SKIP_REQUEST: ReadonlySet<string> = new Set([
  ...HOP_BY_HOP,
  'host',
  'content-length',
  'expect',
  PEER_HEADER,
  INTERNAL_HEADER,
])

/** Not returned to the client: hop-by-hop headers and `content-length` (the listener frames the body). */
export const SKIP_RESPONSE: ReadonlySet<string> = new Set([...HOP_BY_HOP, 'content-length'])

/** connectionTokens: header names a `Connection` value declares hop-by-hop (besides close/keep-alive). */
export function connectionTokens(value: string | null | undefined): string[] {
  if (!value) return []
  const out: string[] = []
  for (const token of value.split(',')) {
    const name = token.trim().toLowerCase()
    if (name && name !== 'close' && name !== 'keep-alive') out.push(name)
  }
  return out
}
