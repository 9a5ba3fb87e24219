import { clientResponseHeaders, upstreamRequestHeaders } from './headers.ts'
import { http1Send } from './http1.ts'
import { type PipeHooks, pipeBody } from './stream.ts'
import { isResetBeforeResponse } from './upstream-errors.ts'

/**
 * sendUpstream sends one request to an upstream; the reply resolves once the response head has
 * arrived. `http://` upstreams (engines, the common case) go through the proxy's own HTTP/1.1
 * client (http1.ts): Bun's fetch caps a process at 256 requests in flight
 * (BUN_CONFIG_MAX_HTTP_REQUESTS, read only at start-up), which would queue the 257th concurrent
 * stream behind the others; the own client also gives exact connect deadlines, socket-level
 * backpressure and immediate aborts, with less work per request. Other schemes (`https://`) use fetch.
 *
 * Errors carry a `code`: ECONNREFUSED, ConnectionClosed, ConnectTimeout, UpstreamProtocolError…;
 * `abort(reason)` rejects (or ends the body) with `reason`.
 */
export interface UpstreamRequest {
  url: string
  method: string
  /** The client's request headers, as received: hop-by-hop ones, host and content-length are not sent. */
  headers: Headers
  body: Uint8Array<ArrayBuffer> | null
  /** Deadline for the TCP connection (0: none). fetch upstreams ignore it (see forward's probe). */
  connectTimeoutMs: number
  /** transport: 'auto' (own client for http://, fetch otherwise) or 'fetch' (always fetch). */
  transport?: Transport
}

export type Transport = 'auto' | 'fetch'

export interface UpstreamCall {
  reply: Promise<UpstreamReply>
  /** abort closes the upstream request at once (the engine sees the disconnect). */
  abort(reason: unknown): void
}

export interface UpstreamReply {
  status: number
  contentType: string | null
  /** Content-Length of the body, or -1 when the body is chunked or close-delimited. */
  length: number
  hasBody: boolean
  /** clientHeaders: the response headers to give the client (hop-by-hop ones and length removed). */
  clientHeaders(): HeadersInit
  /** readAll resolves with the whole body (null when there is none). */
  readAll(): Promise<Uint8Array<ArrayBuffer> | null>
  /** stream hands the body on as a client response body (see PipeHooks). */
  stream(progress: { bytes: number }, hooks: PipeHooks): ReadableStream<Uint8Array>
}

export function sendUpstream(req: UpstreamRequest): UpstreamCall {
  if (!usesFetch(req.url, req.transport)) return http1Send(req)
  return fetchSend(req)
}

/** usesFetch: whether a request goes through fetch (which does not report connection set-up). */
export function usesFetch(url: string, transport: Transport = 'auto'): boolean {
  return transport === 'fetch' || !url.startsWith('http://')
}

function fetchSend(req: UpstreamRequest): UpstreamCall {
  const ac = new AbortController()
  const init: BunFetchRequestInit = {
    method: req.method,
    headers: upstreamRequestHeaders(req.headers),
    body: req.body,
    signal: ac.signal,
    redirect: 'manual',
    decompress: false,
    // Upstreams are addressed directly, never through an HTTP_PROXY from the environment.
    proxy: false,
    // Bun's own idle ceiling (5 min) would cut a long prefill; forward enforces its deadlines.
    timeout: false,
  }
  const reply = (async (): Promise<UpstreamReply> => {
    let res: Response
    try {
      res = await fetch(req.url, init)
    } catch (cause) {
      // A pooled keep-alive socket the upstream had already closed: send once more on a new one.
      if (ac.signal.aborted || !isResetBeforeResponse(cause)) throw cause
      res = await fetch(req.url, { ...init, keepalive: false })
    }
    const length = res.headers.get('content-length')
    return {
      status: res.status,
      contentType: res.headers.get('content-type'),
      length: length === null ? -1 : Number(length),
      hasBody: res.body !== null,
      clientHeaders: () => clientResponseHeaders(res.headers),
      readAll: () => (res.body === null ? Promise.resolve(null) : res.bytes()),
      stream: (progress, hooks) => pipeBody(res.body!, progress, hooks),
    }
  })()
  return { reply, abort: (reason) => ac.abort(reason) }
}
