import type { Telemetry } from '../host/telemetry/telemetry.ts'
import type { InternalHead, InternalRequest } from '../http/auth.ts'
import type { AppError, ErrorShape } from '../http/errors.ts'
import type { ParserLimits } from './request-parser.ts'
import type { InferenceGrant, WireHead, WireRoute } from './route.ts'

/**
 * What a listener's wire front (WireFront, server.ts) is given by the host: its routes, checks and
 * callbacks (FrontOptions), and what it grants its clients (FrontLimits, HEAD_BYTES). Apart from
 * the front so that its connections (connection.ts, dispatch.ts) read the same options without
 * importing the listener that makes them.
 */
export interface FrontOptions {
  name: string
  hostname: string
  port: number
  idleTimeoutSeconds: number
  /** tls: the certificate and key (PEM) the listener presents; absent: plain HTTP. */
  tls?: { cert: string; key: string }
  routes: WireRoute[]
  /** Limits against slow, many and hostile clients (FrontLimits); defaults in DEFAULT_FRONT_LIMITS. */
  front?: Partial<FrontLimits>
  /**
   * guard checks every hot route's request from its head, before any body byte is read (the
   * inference API key); an error is sent as is and the body is never read. A grant (the key's,
   * with its limits) goes with the request to the route, and its `responseHead` on every answer.
   * Hot routes under `/internal/` answer to `internalHead` and `internal` instead.
   */
  guard?: (head: WireHead) => AppError | InferenceGrant | null
  /**
   * internalHead refuses, from the head alone, an `/internal/` request that cannot come from a
   * peer (an unknown pod, an address that is no member's), before its body is read and hashed.
   */
  internalHead?: (req: InternalHead) => AppError | null
  /**
   * internal vets every request whose parsed path starts with `/internal/` (relayed or hot) with
   * its raw body, before anything answers it (the cluster signature: AuthService.vetInternal). A
   * refusal is written in the path's shape; an accepted request goes on with `extraHead` (header
   * lines, each ending CRLF) added when it is relayed to the framework.
   */
  internal?: (req: InternalRequest) => { error: AppError } | { extraHead: string }
  /** The framework's Unix socket, where everything the front does not answer goes. */
  frameworkSocket: string
  /** Error shape of the front's own refusals, by path. */
  shapeOf(path: string): ErrorShape
  /**
   * Called for each request answered on the wire (relayed ones are logged by the framework);
   * `refused`: the front refused it for what the client sent (the client's fault, whatever the status).
   */
  onRequest(method: string, path: string, query: string, status: number, ms: number, refused?: boolean): void
  limits?: Partial<ParserLimits>
  /**
   * telemetry: the request spans of this listener's inference routes (WireRequest.startTrace); the
   * front ends each with its response. Absent or off: no span is made.
   */
  telemetry?: Telemetry
}

/**
 * FrontLimits: what one listener grants its clients, as the best servers set it (nginx's
 * client_header_timeout, client_body_timeout, client_max_body_size, worker_connections).
 */
export interface FrontLimits {
  /** A request head must arrive whole within this (Slowloris); then 408 and close. */
  headTimeoutMs: number
  /**
   * After headTimeoutMs, a body still arriving must average at least this many bytes a second since
   * the request began; below it, 408 and close.
   */
  minBodyBytesPerSecond: number
  /**
   * Open client connections; beyond it a new connection takes the place of the one waiting longest
   * for a head (no complete head since it opened, or a keep-alive one since its last answer) if
   * there is one, else of a reserve one, else it is closed at once.
   */
  maxConnections: number
  /**
   * Connections that have not completed a request head since they opened (silent, or a first head
   * still arriving); a new connection past it cuts the one of them that opened longest ago. 0: half
   * of maxConnections. The rest of the listener is kept for clients that have sent a head.
   */
  maxUnauthenticated: number
  /** Open connections from one client address (0: no cap); beyond it a new one is closed at once. */
  maxConnectionsPerAddress: number
  /**
   * Request bodies held at once, summed over the listener's connections (from the head until the
   * response ends); a request whose body would pass it gets 503 with Retry-After, before its body is
   * read. With the per-request limits, this is the bound on what clients can make the front hold.
   */
  maxBufferedBodyBytes: number
  /**
   * `/internal/` requests whose bodies are being read before their signature is checked; past it,
   * 503 with Retry-After (a flood of unsigned bodies cannot make every pod read and hash them).
   */
  maxUnverifiedInternal: number
  /**
   * Connections accepted past maxConnections that may only ask for `alwaysServe` paths (health),
   * one request each, its head within RESERVE_HEAD_MS; anything else gets 503. Keeps a probe
   * working while the listener is full.
   */
  reserveConnections: number
  /** Largest body relayed to the framework (admin API, imports); inference keeps the parser's limit. */
  relayBodyBytes: number
  /** Deepest JSON nesting relayed to the framework (checked before anything parses the body). */
  maxJsonDepth: number
  /** Paths a reserve connection may ask for. */
  alwaysServe(path: string): boolean
}

export const DEFAULT_FRONT_LIMITS: FrontLimits = Object.freeze({
  headTimeoutMs: 60_000,
  minBodyBytesPerSecond: 1024,
  maxConnections: 10_000,
  maxUnauthenticated: 0,
  maxConnectionsPerAddress: 1024,
  maxBufferedBodyBytes: 1024 * 1024 * 1024,
  maxUnverifiedInternal: 16,
  reserveConnections: 32,
  relayBodyBytes: 16 * 1024 * 1024,
  maxJsonDepth: 64,
  alwaysServe: (path: string) => path === '/api/health' || path.startsWith('/api/health/'),
})

/**
 * HEAD_BYTES: the one limit on a request head, on every listener and route (431 in the path's
 * error shape above it). It is what the two servers behind the front accept, Bun.serve (16 KiB)
 * and the engines' uvicorn (h11: 16 KiB), less room for the lines the front adds (the peer's
 * address, an internal token, a hop's signature), so nothing the front accepts is refused behind it.
 */
export const HEAD_BYTES = 15 * 1024
