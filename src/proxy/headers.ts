/**
 * Header rules of the pass-through proxy (RFC 9110 §7.6.1): hop-by-hop headers belong to one
 * connection and are never forwarded, in either direction; everything else passes unchanged.
 * The own HTTP/1.1 client skips them while writing the request and while reading the response (no
 * Headers copies); the fetch path copies once and deletes them.
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
 * Not sent upstream: hop-by-hop headers, `host` (the upstream's is sent), `content-length` and
 * `expect` (the client frames the forwarded body itself), and PEER_HEADER (only the front sets it).
 */
export const SKIP_REQUEST: ReadonlySet<string> = new Set([
  ...HOP_BY_HOP,
  'host',
  'content-length',
  'expect',
  PEER_HEADER,
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

/** stripHopByHop deletes hop-by-hop headers, including any named in `Connection`. */
export function stripHopByHop(h: Headers): void {
  for (const name of connectionTokens(h.get('connection'))) h.delete(name)
  for (const name of HOP_BY_HOP) h.delete(name)
}

/** upstreamRequestHeaders (fetch path): the client's headers minus what SKIP_REQUEST lists. */
export function upstreamRequestHeaders(src: Headers): Headers {
  const h = new Headers(src)
  stripHopByHop(h)
  h.delete('host')
  h.delete('content-length')
  h.delete('expect')
  h.delete(PEER_HEADER)
  return h
}

/** clientResponseHeaders (fetch path): the upstream's response headers minus SKIP_RESPONSE. */
export function clientResponseHeaders(src: Headers): Headers {
  const h = new Headers(src)
  stripHopByHop(h)
  h.delete('content-length')
  return h
}

/**
 * clientResponseInit (HTTP/1.1 path): received header pairs minus SKIP_RESPONSE, as a plain object
 * (the cheapest form for the Response constructor) or, when a name repeats (set-cookie), as pairs.
 */
export function clientResponseInit(pairs: [string, string][], connection: string): HeadersInit {
  const extra = connectionTokens(connection)
  const out: Record<string, string> = {}
  for (const pair of pairs) {
    const name = pair[0]
    if (SKIP_RESPONSE.has(name) || (extra.length > 0 && extra.includes(name))) continue
    if (name in out) return pairs.filter(([n]) => !SKIP_RESPONSE.has(n) && !extra.includes(n))
    out[name] = pair[1]
  }
  return out
}
