import type { RequestTrace } from '../host/telemetry/spans.ts'
import type { AppError } from '../http/errors.ts'
import type { BodyRange } from './body-range.ts'
import type { ScanFailure, ScannedJson } from './json-scan.ts'
import type { TokenUsage, UsageMode } from './usage.ts'

/**
 * The contract between the wire front (server.ts) and a plugin's hot routes. A route that can
 * answer on the wire implements `wire`: it sees the parsed request (body already read) and returns
 * what to do — an error, a JSON reply, a forward to an `http://` upstream that the front carries
 * out socket to socket (src/wire/exchange.ts), or a decision deferred until a wait is over
 * (holding a request while a model wakes). Returning null leaves the request to the framework (the
 * same route's Request-based handler behind the front), e.g. for an `https://` upstream.
 */
export interface WireHead {
  readonly method: string
  /** Path without the query. */
  readonly path: string
  /** '' or '?…'. */
  readonly query: string
  /** header returns the first value of a lower-case header name, or null. */
  header(name: string): string | null
}

/**
 * InferenceGrant: what a listener's guard (or a route's admission) vouched for from a request's head:
 * an inference key with its limits (src/http/keys/). The front hands it to the route and adds its
 * `responseHead` to every answer to the request; the model directory asks `begin` once the model is
 * known and calls `end` once when the request has ended, whatever its end.
 */
export interface InferenceGrant {
  /** Header lines (each ending CRLF), '' for none: the key's rate-limit state as the request found it. */
  readonly responseHead: string
  /** The key's place in every queue that holds requests (0 high, 1 normal, 2 low). */
  readonly priority: number
  /**
   * party: the key as a queue counts it (its id, and its max_concurrent, which may widen its share
   * of a held queue); null or absent: no key of its own (the static key), bound only by the queue.
   */
  readonly party?: { readonly id: string; readonly maxConcurrent: number | null } | null
  /** metered: the key has a token limit (tpm or a budget), so `begin` needs the request's worst case. */
  readonly metered: boolean
  /**
   * begin: the request is for `model` (one a backend serves) and may use up to `worst` tokens
   * (requestCost, usage.ts: what the key reserves against its token limits until the end); null to
   * go on, or the refusal (a model the key may not use, its concurrency, a reservation that does not fit).
   */
  begin(model: string, worst: number): AppError | null
  /**
   * allows: whether the key may act on `model` at all (its model list), for an action that is no
   * inference request (the router's sleep and wakeup): null, or the 403 refusal. Counts nothing.
   */
  allows(model: string): AppError | null
  /** lists: whether `model` is on the key's model list (a key with no list has every model); counts nothing. */
  lists(model: string): boolean
  /**
   * end: the request has ended with `status`, having used `usage` (null: not known): once, whether
   * it began or was refused before (then it is counted as a refusal, under no model's name).
   */
  end(status: number, usage: TokenUsage | null): void
}

export interface WireRequest extends WireHead {
  /** The complete body (read it with text(), copyTo() or bytes()). */
  readonly body: BodyRange
  /** performance.now() when the request was complete. */
  readonly startedAt: number
  /**
   * json: the body scanned as a JSON object within the listener's depth limit (server.max_json_depth),
   * its routing fields located without parsing the rest (json-scan.ts); scanned once, when first asked.
   */
  json(): ScannedJson | ScanFailure
  /** grant: what the guard or the route's admission vouched for from the head (null: none, inference is open). */
  readonly grant: InferenceGrant | null
  /**
   * startTrace: an inference route starts its request's server span here, once it knows the request
   * is one (`route`: the route's path, the span's name; `model`: what the body names). The front
   * fills in what it knows (method, the client's `traceparent`, the client and listener addresses)
   * and ends the span with the response: its status, time to first token, and the engine's usage
   * when the answer carries it. Null when tracing is off: one check, nothing made. A second call
   * returns the span of the first.
   */
  startTrace(route: string, model?: string): RequestTrace | null
  /** trace: the span startTrace started (null: none), which the route hands down with its plan. */
  readonly trace: RequestTrace | null
}

/**
 * Admission: what a hot route decides from a request's head alone, before any byte of its body is
 * read: go on (null), refuse now (an AppError: the body is never read), or `anonymous`: the route
 * cannot tell yet (it will once it sees the body, e.g. the router's models that need no key) and
 * the request has shown no credential, so its body gets the small limit of a request nobody has
 * vouched for (server.max_admin_body_bytes) instead of an inference body's; or a grant, the key
 * the route itself judged (the router's, for the gateway's models).
 */
export type Admission = AppError | 'anonymous' | InferenceGrant | null

/** ForwardEnd: the outcome of one forwarded request, reported once when its response has fully ended. */
export interface ForwardEnd {
  /**
   * Outcome status: the upstream's status; 499 when the client went away before the end; the
   * 502/504 of the proxy error when the upstream failed (even after a 200 stream had started).
   */
  status: number
  /** Response body bytes handed to the client. */
  bytes: number
  durationMs: number
  /** Streams only: time from the request's arrival to the first body bytes. */
  ttftMs: number | null
  /** The body was streamed (event stream or unknown length) rather than returned whole. */
  streamed: boolean
  /** The client went away before the response ended. */
  aborted: boolean
  /** Proxy error code when the upstream failed (upstream_unavailable, upstream_timeout, …). */
  error?: string
  /** The engine's token counts, when the forward was asked to read them (WireForwardAction.usage) and saw them. */
  usage?: TokenUsage
  /**
   * chunks: a stream read for usage: its output events that reached the client (UsageStream.chunks),
   * what the request is charged for when the stream ended before the engine's own count.
   */
  chunks?: number
  /** Each choice's finish reason, read for a recording span (see WireForward.trace). */
  finishReasons?: string[]
}

export interface WireForwardAction {
  /**
   * The upstream's `http://host:port`, kept apart from the target so the front looks it up as the
   * same string each time (a lease's stored base URL) instead of splitting a fresh URL per request.
   */
  origin: string
  /** Path and query on the upstream. */
  target: string
  /** The body to send (the client's, or a rewritten copy). */
  body: BodyRange
  /**
   * extraHead: header lines (each ending CRLF) sent before the client's own, e.g. a pod-to-pod hop's
   * signature; absent for none. The client's fields still pass as received (minus hop-by-hop ones).
   */
  extraHead?: string
  /**
   * dropHeaders: lower-case names of the client's fields not to forward (besides hop-by-hop ones),
   * e.g. a hop drops a client's own X-Cluster-* fields, which would sit beside the hop's signature.
   */
  dropHeaders?: readonly string[]
  firstByteTimeoutMs: number
  connectTimeoutMs: number
  /** responseHead: header lines (each ending CRLF) added to the response head (the grant's); absent: none. */
  responseHead?: string
  /**
   * usage: read the engine's token counts from the response into ForwardEnd.usage (src/wire/usage.ts);
   * `strip`: and take the usage chunk the request was made to ask for out of the client's stream.
   */
  usage?: UsageMode
  /**
   * retry: the upstream refused the connection, so nothing of the request was sent: what to do
   * instead comes from `retry.next` (the model directory's lease: the next backend, or the error),
   * and `onEnd` is not called for this forward. Absent: the front answers 502. Only a refused
   * connection is retried this way, never a connect timeout or a failure after bytes were sent.
   */
  retry?: { next(reason: unknown): WireAction }
  /** Called exactly once when the response has fully ended (see ForwardEnd), unless retried. */
  onEnd(info: ForwardEnd): void
}

/**
 * WireAction: what the front does with a request. `defer` is a decision that takes time (hold the
 * request until a model is awake): the front keeps the connection (no idle timeout, pipelined
 * requests wait, shutdown's drain counts it) and carries out the action the promise resolves to.
 * `signal` aborts when the client goes away; a forward resolved after that is ended as 499 by the
 * front (its onEnd runs), so a lease taken for it is never leaked.
 */
export type WireAction =
  | { error: AppError }
  | { json: unknown; status?: number }
  | { forward: WireForwardAction }
  | { defer(signal: AbortSignal): Promise<WireAction> }

/**
 * WireRoute: a hot route as the front's table holds it: `match` on the parsed path and method, then
 * `admit` from the head and `wire` with the complete request.
 */
export interface WireRoute {
  match(path: string, method: string): boolean
  /**
   * admit decides from the head, before any body byte is read (after the listener's guard passed):
   * see Admission. Absent: go on.
   */
  admit?(head: WireHead): Admission
  /** The decision for a matched request; null leaves it to the framework (which has no hot routes). */
  wire(req: WireRequest): WireAction | null
}
