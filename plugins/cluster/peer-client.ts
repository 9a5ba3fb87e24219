import { abortable, WaitError } from '../../src/host/abortable.ts'
import type { Logger } from '../../src/host/logger.ts'
import { AppError } from '../../src/http/errors.ts'
import { addressedTo, CLUSTER_HEADERS, signRequest } from './signing.ts'

/**
 * PeerError is a peer's refusal or failure as the caller sees it: the peer's own status, code and
 * message when it answered (e.g. 409 `STALE_TERM`, with `peerTerm` the highest term the peer has
 * seen), 502 `PEER_UNAVAILABLE` when it could not be reached, 504 `PEER_TIMEOUT` past the deadline.
 */
export class PeerError extends AppError {
  constructor(
    status: number,
    code: string,
    message: string,
    /** The peer's base URL. */
    readonly peer: string,
    /** The peer's X-Cluster-Term on its answer (its highest term seen), when it sent one. */
    readonly peerTerm: number | null = null,
  ) {
    super(status, code, message)
    this.name = 'PeerError'
  }
}

export interface PeerClientOptions {
  /** auth.cluster_secret: requests are signed with the current secret only. */
  secret: string
  podId: string
  /** The highest leader term this pod has seen, sent as X-Cluster-Term. */
  term: () => number
  /** Deadline of one request (plugins.cluster.request_timeout_ms). */
  timeoutMs: number
  log: Logger
}

/** PeerTarget: the pod a call is for: its id (signed into the call, `to=`) and its base URL. */
export interface PeerTarget {
  podId: string
  address: string
}

/** PeerCalls: what the cluster's services use of PeerClient (so a test may stand in for it). */
export type PeerCalls = Pick<PeerClient, 'request' | 'stream'>

export interface PeerRequestOptions {
  signal?: AbortSignal
  /** This call's deadline instead of the client's. */
  timeoutMs?: number
}

/**
 * PeerClient is the control plane's one way to call another pod's `/internal/*` API: addressed to
 * that pod and signed with the current secret (signing.ts), sent with `fetch`, under a deadline. The data-plane hop (a chat
 * relayed to the pod that serves the model) goes through the wire front's pool instead
 * (src/wire/pool.ts), never through here.
 *
 * Timestamps are strictly increasing within the process, so two identical calls in the same
 * millisecond still carry different signatures (the receiver refuses a signature it has seen).
 */
export class PeerClient {
  private lastStamp = 0

  constructor(private readonly opts: PeerClientOptions) {}

  /**
   * request sends one signed call to `pod` (addressed to its id, at its base URL) and returns its JSON
   * (undefined for an empty body). A non-2xx answer throws a PeerError with the peer's status, code
   * and message; no connection → 502, past the deadline → 504, both naming the peer. The caller's
   * own `signal` rejects with the WaitError of src/host/abortable.ts.
   */
  async request<T = unknown>(
    pod: PeerTarget,
    method: string,
    pathWithQuery: string,
    body?: unknown,
    opts: PeerRequestOptions = {},
  ): Promise<T> {
    const { address } = pod
    const target = addressedTo(pathWithQuery, pod.podId)
    const bytes = body === undefined ? new Uint8Array(0) : Buffer.from(JSON.stringify(body))
    const url = peerUrl(address, target)
    const timeoutMs = opts.timeoutMs ?? this.opts.timeoutMs
    const what = `${method} ${url}`
    const cancel = new AbortController()
    const exchange = async () => {
      const res = await fetch(url, {
        method,
        headers: this.headers(method, target, bytes, body !== undefined),
        ...(body === undefined ? {} : { body: bytes }),
        signal: opts.signal ? AbortSignal.any([opts.signal, cancel.signal]) : cancel.signal,
      })
      return { res, text: await res.text() }
    }
    let answer: { res: Response; text: string }
    try {
      answer = await abortable(exchange(), { signal: opts.signal, timeoutMs, what })
    } catch (err) {
      cancel.abort()
      throw this.failure(err, address, what, timeoutMs)
    }
    const { res, text } = answer
    if (!res.ok) throw peerRefusal(address, res, text)
    if (text === '') return undefined as T
    try {
      return JSON.parse(text) as T
    } catch {
      throw new PeerError(
        502,
        'PEER_BAD_RESPONSE',
        `Peer ${address} answered ${what} with invalid JSON`,
        address,
      )
    }
  }

  /**
   * stream opens a signed GET for an event stream relayed from a peer and returns its Response once
   * the head has arrived (within the client's deadline). The body has no deadline: it ends when the
   * peer ends it or `signal` aborts. A non-2xx answer or no connection throws as request does.
   */
  async stream(pod: PeerTarget, pathWithQuery: string, signal: AbortSignal): Promise<Response> {
    const { address } = pod
    const target = addressedTo(pathWithQuery, pod.podId)
    const url = peerUrl(address, target)
    const what = `GET ${url}`
    const cancel = new AbortController()
    const timeoutMs = this.opts.timeoutMs
    let res: Response
    try {
      res = await abortable(
        fetch(url, {
          method: 'GET',
          headers: this.headers('GET', target, new Uint8Array(0), false),
          signal: AbortSignal.any([signal, cancel.signal]),
        }),
        { signal, timeoutMs, what },
      )
    } catch (err) {
      cancel.abort()
      throw this.failure(err, address, what, timeoutMs)
    }
    if (!res.ok) {
      const text = await abortable(res.text(), { signal, timeoutMs, what }).catch(() => '')
      throw peerRefusal(address, res, text)
    }
    return res
  }

  /** headers: the signature headers of `target` (path, query and destination, exactly as sent). */
  private headers(method: string, target: string, body: Uint8Array, json: boolean): Record<string, string> {
    const stamp = Math.max(Date.now(), this.lastStamp + 1)
    this.lastStamp = stamp
    return {
      [CLUSTER_HEADERS.signature]: signRequest(this.opts.secret, method, target, stamp, body),
      [CLUSTER_HEADERS.timestamp]: String(stamp),
      [CLUSTER_HEADERS.pod]: this.opts.podId,
      [CLUSTER_HEADERS.term]: String(this.opts.term()),
      ...(json ? { 'content-type': 'application/json' } : {}),
    }
  }

  /** failure: what a call that got no answer throws (the caller's own abort passes through). */
  private failure(err: unknown, address: string, what: string, timeoutMs: number): unknown {
    if (err instanceof WaitError && err.kind === 'timeout') {
      this.opts.log.debug('peer call timed out', { peer: address, call: what, timeout_ms: timeoutMs })
      return new PeerError(
        504,
        'PEER_TIMEOUT',
        `Peer ${address} did not answer ${what} within ${timeoutMs} ms`,
        address,
      )
    }
    if (err instanceof WaitError) return err
    // Bun's fetch appends advice for developers ("For more information, pass `verbose: true`...").
    const reason = (err instanceof Error ? err.message : String(err)).replace(
      /\s*For more information, pass `verbose: true`.*$/s,
      '',
    )
    this.opts.log.debug('peer call failed', { peer: address, call: what, error: reason })
    return new PeerError(
      502,
      'PEER_UNAVAILABLE',
      `Peer ${address} is unreachable (${what}): ${reason}`,
      address,
    )
  }
}

function peerUrl(address: string, pathWithQuery: string): string {
  return `${address.endsWith('/') ? address.slice(0, -1) : address}${pathWithQuery}`
}

/**
 * peerRefusal reads a non-2xx answer: either error shape (controller or proxy), else the
 * status alone; the peer's X-Cluster-Term, when sent, rides along as `peerTerm`.
 */
function peerRefusal(address: string, res: Response, text: string): PeerError {
  let code = `PEER_HTTP_${res.status}`
  let message = `Peer ${address} answered ${res.status}`
  try {
    const error = (JSON.parse(text) as { error?: { code?: unknown; message?: unknown } }).error
    if (typeof error?.code === 'string') code = error.code
    if (typeof error?.message === 'string') message = error.message
  } catch {
    // Not JSON: the status says it all.
  }
  const term = res.headers.get(CLUSTER_HEADERS.term)
  const peerTerm = term !== null && /^\d{1,16}$/.test(term) ? Number(term) : null
  return new PeerError(res.status, code, message, address, peerTerm)
}
