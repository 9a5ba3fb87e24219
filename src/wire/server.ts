import type { Socket, TCPSocketListener } from 'bun'
import type { RequestTrace } from '../host/telemetry/spans.ts'
import type { Telemetry } from '../host/telemetry/telemetry.ts'
import type { InternalHead, InternalRequest } from '../http/auth.ts'
import { AppError, type ErrorShape, internalError } from '../http/errors.ts'
import { BodyRange } from './body-range.ts'
import { type WireClient, WireExchange } from './exchange.ts'
import { PEER_HEADER } from './headers.ts'
import type { ScanFailure, ScannedJson } from './json-scan.ts'
import { upstreams, writeAll } from './pool.ts'
import {
  header,
  nameAt,
  type ParsedRequest,
  type ParserLimits,
  RequestError,
  type RequestHead,
  RequestParser,
} from './request-parser.ts'
import { errorResponse, jsonResponse } from './responses.ts'
import type { Admission, ForwardEnd, InferenceGrant, WireAction, WireHead, WireRequest } from './route.ts'

/**
 * WireFront is what listens on a listener's public port: an HTTP/1.1 server on Bun's TCP sockets,
 * in front of the framework (Bun.serve + Elysia), which listens on a private Unix socket. It is
 * built the way nginx fronts an application server, because Bun.serve's per-request cost
 * (Request, Headers, Response and stream objects, about 30 µs of CPU for a proxied request on
 * these machines) is twice what a socket-to-socket proxy costs; see test/perf/proxy.ts.
 *
 * - Hot routes (the inference proxy) that implement `wire` are answered here: the request is
 *   parsed strictly (request-parser.ts), the route decides, and a forward runs socket to socket
 *   (WireExchange).
 * - Everything else (admin API, docs, metrics, event streams, and hot requests a route leaves to
 *   the framework) is relayed to the framework's socket by the same WireExchange, re-framed
 *   (validated field lines, its own Content-Length: the framework never sees ambiguous framing),
 *   and its response is relayed back.
 * - Requests under `/internal/` (the cluster's signed API) are vetted first, relayed or hot, on the
 *   raw body as received (FrontOptions.internal): the framework behind only ever sees the body
 *   parsed, so this is the one place a signature over the bytes can be checked.
 * - Connections: keep-alive and pipelining (one request at a time, in order), `100 Continue`,
 *   strict refusals with the listener's error shape, an idle timeout between requests (never
 *   while a response is running: a long generation is not cut), and the client going away aborts
 *   what it asked for at once.
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

export interface FrontOptions {
  name: string
  hostname: string
  port: number
  idleTimeoutSeconds: number
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
   * Open client connections; beyond it (and the reserve) a new connection takes the place of an
   * idle keep-alive one if there is one, else it is closed at once.
   */
  maxConnections: number
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

/** How often the front looks for requests that are arriving too slowly. */
const SWEEP_MS = 1000
/**
 * A reserve connection (accepted past the cap, for health only) must send its whole head within
 * this: a probe sends at once, so idle connections cannot sit in the reserve.
 */
const RESERVE_HEAD_MS = 2000
/**
 * Lingering close (nginx's lingering_timeout and lingering_time): after an early refusal (413, 431,
 * 401 from the head...) the client may still be sending; closing at once would make the kernel
 * answer its next bytes with a reset that can destroy the refusal before the client reads it. So
 * the front sends its FIN, then reads and discards until the client closes, for at most
 * LINGER_MS in all and LINGER_QUIET_MS without a byte.
 */
const LINGER_MS = 30_000
const LINGER_QUIET_MS = 5000

/** Pipelined bytes held while a response runs before the connection stops being read. */
const MAX_PIPELINED = 1024 * 1024
/** Relays to the framework's own socket: connect deadline (it is local), no first-byte deadline. */
const FRAMEWORK_CONNECT_MS = 5000

const REFUSAL_CODES: Record<number, string> = {
  400: 'BAD_REQUEST',
  408: 'REQUEST_TIMEOUT',
  413: 'PAYLOAD_TOO_LARGE',
  417: 'EXPECTATION_FAILED',
  431: 'HEADERS_TOO_LARGE',
  501: 'NOT_IMPLEMENTED',
  503: 'SERVICE_UNAVAILABLE',
  505: 'HTTP_VERSION_NOT_SUPPORTED',
}

/** refusal: the front's own refusal with a status, in REFUSAL_CODES' words, and Retry-After when given. */
function refusal(status: number, message: string, retryAfterSeconds?: number): AppError {
  const headers: Record<string, string> = retryAfterSeconds
    ? { 'retry-after': String(retryAfterSeconds) }
    : {}
  return new AppError(status, REFUSAL_CODES[status] ?? 'BAD_REQUEST', message, undefined, undefined, headers)
}

/** Content types whose body the framework parses as JSON (and an absent one, which it may sniff). */
const JSON_TYPE = /json/i

export class WireFront {
  private readonly listener: TCPSocketListener<ClientConn>
  readonly conns = new Set<ClientConn>()
  readonly limits: FrontLimits
  /** Connections accepted past maxConnections (reserve: health only). */
  overflow = 0
  /** Connections closed at once because the listener was full (a metric's worth, and for tests). */
  rejected = 0
  /** Idle keep-alive connections closed to make room for a new one while the listener was full. */
  reclaimed = 0
  /** Open connections by client address (for maxConnectionsPerAddress). */
  private readonly perAddress = new Map<string, number>()
  /** Body bytes held for requests now (see FrontLimits.maxBufferedBodyBytes). */
  bufferedBodyBytes = 0
  /** `/internal/` requests whose bodies are arriving before their signature is checked. */
  unverifiedInternal = 0
  /** Requests running that drain waits for: forwards to engines and hot routes left to the framework. */
  private inflight = 0
  private drainWaiters: (() => void)[] = []
  private readonly sweeper: Timer
  private stopping = false
  /** tracing: the telemetry when it is on (null: off, the one check a request's startTrace makes). */
  readonly tracing: Telemetry | null

  constructor(readonly opts: FrontOptions) {
    const front = this
    this.limits = { ...DEFAULT_FRONT_LIMITS, ...opts.front }
    this.tracing = opts.telemetry?.enabled ? opts.telemetry : null
    const limits = this.limits
    this.listener = Bun.listen<ClientConn>({
      hostname: opts.hostname,
      port: opts.port,
      socket: {
        open(s) {
          // Past a cap, close before reading anything: accept() never meets the fd limit, so the
          // process never spins on it, and connections already open keep being served.
          const address = s.remoteAddress
          const fromAddress = front.perAddress.get(address) ?? 0
          const perAddress = limits.maxConnectionsPerAddress
          let full = front.conns.size >= limits.maxConnections
          // A full listener first makes room by closing an idle keep-alive connection, as nginx
          // reuses its keep-alive connections: a client waiting between requests yields to a new one.
          if (full && front.reclaimIdle()) full = front.conns.size >= limits.maxConnections
          if (
            (perAddress > 0 && fromAddress >= perAddress) ||
            (full && front.overflow >= limits.reserveConnections)
          ) {
            front.rejected++
            s.terminate()
            return
          }
          s.data = new ClientConn(front, s, full, address)
          front.conns.add(s.data)
          front.perAddress.set(address, fromAddress + 1)
          if (full) front.overflow++
          if (front.opts.idleTimeoutSeconds > 0) s.timeout(front.opts.idleTimeoutSeconds)
        },
        data(s, d) {
          s.data?.onData(d as Buffer)
        },
        drain(s) {
          s.data?.onDrain()
        },
        close(s) {
          s.data?.onClose()
        },
        error(s) {
          s.data?.onClose()
        },
        timeout(s) {
          s.data?.onTimeout()
        },
      },
    })
    this.sweeper = setInterval(() => this.sweep(), SWEEP_MS)
    this.sweeper.unref()
  }

  /** sweep refuses requests that arrive too slowly (a head past its deadline, a body below the rate). */
  private sweep(): void {
    const now = performance.now()
    for (const c of this.conns) c.checkArrival(now)
  }

  /** reclaimIdle closes one connection idle between requests (the least recently active); false if none. */
  reclaimIdle(): boolean {
    let oldest: ClientConn | null = null
    for (const c of this.conns)
      if (c.idleSince !== null && (!oldest || c.idleSince < oldest.idleSince!)) oldest = c
    if (!oldest) return false
    this.reclaimed++
    oldest.closeIdle()
    return true
  }

  /** forget: a connection closed (its address's count). */
  forget(address: string): void {
    const n = (this.perAddress.get(address) ?? 1) - 1
    if (n > 0) this.perAddress.set(address, n)
    else this.perAddress.delete(address)
  }

  /** inferenceStarted / inferenceEnded count the requests drain() waits for. */
  inferenceStarted(): void {
    this.inflight++
  }

  inferenceEnded(): void {
    if (--this.inflight > 0) return
    const waiters = this.drainWaiters
    this.drainWaiters = []
    for (const w of waiters) w()
  }

  /** running: inference requests (forwards and held requests) not finished yet. */
  get running(): number {
    return this.inflight
  }

  /** drained resolves once no inference request is running (at once when none is). */
  drained(): Promise<void> {
    if (this.inflight === 0) return Promise.resolve()
    return new Promise((resolve) => this.drainWaiters.push(resolve))
  }

  get hostname(): string {
    return this.listener.hostname
  }

  get port(): number {
    return this.listener.port
  }

  get stopped(): boolean {
    return this.stopping
  }

  match(path: string, method: string): WireRoute | undefined {
    for (const r of this.opts.routes) if (r.match(path, method)) return r
    return undefined
  }

  /**
   * stop: no new connections; idle ones close now, busy ones after their response. `force` closes
   * every connection at once (what is running is aborted).
   */
  stop(force: boolean): void {
    if (!this.stopping) {
      this.stopping = true
      this.listener.stop(false)
    }
    if (force) clearInterval(this.sweeper)
    for (const c of [...this.conns]) c.shutdown(force)
  }
}

/** Running: what a client connection waits on while a request is answered. */
interface Running {
  /** The client's connection closed: stop, and release what is held. */
  onClientClose(): void
  /** The client's connection can take more bytes. */
  onClientDrain(): void
}

/**
 * ParsedWireRequest: a hot route's request, made when its head is complete (what admission sees)
 * and completed with its body.
 */
class ParsedWireRequest implements WireRequest {
  private scanned: ScannedJson | ScanFailure | undefined = undefined
  body: BodyRange = BodyRange.EMPTY
  startedAt = 0
  grant: InferenceGrant | null = null
  trace: RequestTrace | null = null

  constructor(
    private readonly head: RequestHead,
    private readonly maxJsonDepth: number,
    private readonly conn: ClientConn,
  ) {}

  json(): ScannedJson | ScanFailure {
    this.scanned ??= this.body.scanJson(this.maxJsonDepth)
    return this.scanned
  }

  startTrace(route: string, model?: string): RequestTrace | null {
    if (this.conn.tracing === null) return null
    this.trace ??= this.conn.requestSpan(this.head, route, model)
    return this.trace
  }

  get method(): string {
    return this.head.method
  }

  get path(): string {
    return this.head.path
  }

  get query(): string {
    return this.head.query
  }

  header(name: string): string | null {
    return header(this.head, name)
  }
}

/**
 * HeadRefusal: a request refused from its head (its key, its size against what is left, a reserve
 * connection asking for more than health), thrown out of the parser's head callback before any
 * body byte is read, and answered in `shape`.
 */
class HeadRefusal extends Error {
  constructor(
    readonly error: AppError,
    readonly shape: ErrorShape,
  ) {
    super(error.message)
  }
}

class ClientConn implements WireClient {
  private readonly parser: RequestParser
  /** What runs for the request being answered: an exchange, or a deferred decision (Waiting). */
  private current: Running | null = null
  /** Bytes the socket did not take yet, in order; null when none, so a write checks one field. */
  private queue: Uint8Array[] | null = null
  private closed = false
  private closing = false
  private paused = false
  private sentContinue = false
  private lastActive = performance.now()
  /** performance.now() when the first byte of the request now arriving came (0: none arriving). */
  private arriving = 0
  /** The running exchange is one drain waits for (counted in the front's inflight). */
  private inference = false
  /** The hot route of the head the parser read last (admitted then; handle reuses it). */
  private route: WireRoute | undefined = undefined
  /** The hot request whose head was admitted (its body is arriving or complete). */
  private request: ParsedWireRequest | null = null
  /** Body bytes this connection holds against the listener's maxBufferedBodyBytes. */
  private held = 0
  /** The request now arriving is an `/internal/` one counted in the front's unverifiedInternal. */
  private unverified = false
  /** performance.now() when a lingering close began (0: not lingering). */
  private lingerStart = 0
  http10 = false

  constructor(
    private readonly front: WireFront,
    private readonly socket: Socket<ClientConn>,
    /** reserve: accepted past the listener's cap; serves one request for an alwaysServe path. */
    private readonly reserve: boolean,
    /** The client's address, as counted in the front's per-address map. */
    private readonly address: string,
  ) {
    this.parser = new RequestParser({
      maxHeadBytes: HEAD_BYTES,
      ...front.opts.limits,
      bodyLimit: (head) => this.admit(head),
    })
    // A connection's first head is due from when it opened: one that never sends a byte is cut at
    // the head deadline like a slow one, instead of being held until the idle timeout.
    this.arriving = this.lastActive
  }

  /**
   * admit is the head stage, run the moment a head is complete, before any byte of its body is
   * read: what a reserve connection may ask, the internal check of what can come from a peer, the
   * hot route's guard (the inference key) and admission, and the body's room in the listener's
   * budget. Returns the body limit; a refusal is thrown (HeadRefusal) and the body never read.
   */
  private admit(head: RequestHead): number {
    const front = this.front
    const limits = front.limits
    this.route = undefined
    this.request = null
    const shape = front.opts.shapeOf(head.path)
    if (this.reserve && !limits.alwaysServe(head.path))
      throw new HeadRefusal(refusal(503, 'The listener is at its connection limit; retry later', 1), shape)
    let limit = limits.relayBodyBytes
    if (front.opts.internal !== undefined && head.path.startsWith('/internal/')) {
      const denied = front.opts.internalHead?.(this.internalHead(head)) ?? null
      if (denied) throw new HeadRefusal(denied, shape)
      if (front.unverifiedInternal >= limits.maxUnverifiedInternal)
        throw new HeadRefusal(
          refusal(503, 'Too many internal requests being verified; retry later', 1),
          shape,
        )
      front.unverifiedInternal++
      this.unverified = true
      this.route = front.match(head.path, head.method)
      if (this.route) limit = Number.POSITIVE_INFINITY
    } else {
      const route = front.match(head.path, head.method)
      if (route) {
        const req = new ParsedWireRequest(head, limits.maxJsonDepth, this)
        const guarded = front.opts.guard?.(req) ?? null
        if (guarded instanceof AppError) throw new HeadRefusal(guarded, 'proxy')
        req.grant = guarded
        const admission = route.admit?.(req) ?? null
        if (admission instanceof AppError) throw new HeadRefusal(admission, 'proxy')
        if (admission !== null && admission !== 'anonymous') req.grant = admission
        this.route = route
        this.request = req
        limit = admission === 'anonymous' ? limits.relayBodyBytes : Number.POSITIVE_INFINITY
      }
    }
    this.hold(head.chunked ? 0 : Math.max(0, head.contentLength), head.path)
    return limit
  }

  /**
   * hold counts `bytes` of body held by this connection (the Content-Length from the head, or what a
   * chunked body has grown to) against the listener's budget; past it, 503 before more is read.
   */
  private hold(bytes: number, path: string): void {
    const extra = bytes - this.held
    if (extra <= 0) return
    const front = this.front
    if (front.bufferedBodyBytes + extra > front.limits.maxBufferedBodyBytes) {
      const error = refusal(503, 'The server holds as many request bodies as it may; retry later', 1)
      throw new HeadRefusal(
        error,
        this.route && !path.startsWith('/internal/') ? 'proxy' : front.opts.shapeOf(path),
      )
    }
    front.bufferedBodyBytes += extra
    this.held = bytes
  }

  /** release gives back the body bytes and the unverified count of the request that ended. */
  private release(): void {
    if (this.held > 0) {
      this.front.bufferedBodyBytes -= this.held
      this.held = 0
    }
    if (this.unverified) {
      this.unverified = false
      this.front.unverifiedInternal--
    }
  }

  /** idleSince: when the connection went idle between requests (null: busy, arriving or closing). */
  get idleSince(): number | null {
    return this.current || this.closing || this.arriving !== 0 || this.parser.buffered > 0
      ? null
      : this.lastActive
  }

  /** closeIdle: the front reclaims this idle keep-alive connection for a new one. */
  closeIdle(): void {
    this.closing = true
    this.socket.end()
  }

  onData(data: Buffer): void {
    // One clock reading serves as the connection's last activity and the request's start.
    const now = performance.now()
    this.lastActive = now
    // Closing (lingering after a refusal): what the client still sends is read and dropped.
    if (this.closing) return
    if (this.arriving === 0 && !this.current) this.arriving = now
    this.parser.push(data)
    const pending = this.parser.pendingHead
    if (pending?.chunked) {
      // A chunked body counts against the budget as it grows (its length was not in the head).
      try {
        this.hold(this.parser.buffered, pending.path)
      } catch (err) {
        this.refuse(err)
        return
      }
    }
    if (this.current) {
      // Pipelined requests wait for the running response; stop reading if they pile up.
      if (this.parser.buffered > MAX_PIPELINED && !this.paused) {
        this.paused = true
        this.socket.pause()
      }
      return
    }
    this.drive(now)
  }

  /** drive handles the buffered requests, one at a time, until one is running or bytes run out. */
  private drive(now: number): void {
    while (!this.current && !this.closing) {
      let r: ParsedRequest | null
      try {
        r = this.parser.next()
      } catch (err) {
        this.refuse(err)
        return
      }
      if (!r) {
        const pending = this.parser.pendingHead
        if (pending?.expectContinue && !this.sentContinue) {
          this.sentContinue = true
          this.write(`${pending.http10 ? 'HTTP/1.0' : 'HTTP/1.1'} 100 Continue\r\n\r\n`)
        }
        if (this.parser.buffered === 0 && !pending) this.arriving = 0
        return
      }
      this.sentContinue = false
      // Bytes already here for a pipelined request start its clock now.
      this.arriving = this.parser.buffered > 0 ? now : 0
      this.handle(r, now)
    }
  }

  /**
   * checkArrival (the front's sweep): a request head not complete headTimeoutMs after its first
   * byte, or a body then averaging less than minBodyBytesPerSecond, gets 408 and the connection
   * closes. A running response is never cut here.
   */
  checkArrival(now: number): void {
    if (this.lingerStart > 0) {
      if (now - this.lingerStart > LINGER_MS || now - this.lastActive > LINGER_QUIET_MS)
        this.socket.terminate()
      return
    }
    if (this.arriving === 0 || this.current || this.closing) return
    const { minBodyBytesPerSecond } = this.front.limits
    const headTimeoutMs = this.reserve
      ? Math.min(RESERVE_HEAD_MS, this.front.limits.headTimeoutMs)
      : this.front.limits.headTimeoutMs
    const elapsed = now - this.arriving
    if (elapsed <= headTimeoutMs) return
    if (this.parser.pendingHead) {
      const due = ((elapsed - headTimeoutMs) * minBodyBytesPerSecond) / 1000
      if (this.parser.buffered >= due) return
      this.refuse(new RequestError(408, 'request body arriving too slowly'))
    } else this.refuse(new RequestError(408, 'request head not received in time'))
  }

  /** handle runs one complete request; `startedAt` is performance.now() when it was complete. */
  private handle(r: ParsedRequest, startedAt: number): void {
    const head = r.head
    this.http10 = head.http10
    const vet = this.front.opts.internal
    const internal = vet !== undefined && head.path.startsWith('/internal/')
    let extraHead = ''
    if (internal) {
      let vetted: { error: AppError } | { extraHead: string }
      try {
        vetted = vet(this.internalRequest(r))
      } catch (err) {
        console.error('internal request check failed', err)
        vetted = { error: internalError() }
      }
      // Verified (or refused): it no longer counts as a body read on trust.
      if (this.unverified) {
        this.unverified = false
        this.front.unverifiedInternal--
      }
      if ('error' in vetted) {
        this.answerError(head, vetted.error, this.front.opts.shapeOf(head.path), startedAt)
        return
      }
      extraHead = vetted.extraHead
    }
    // Matched and admitted once, when the head was complete (admit).
    const route = this.route
    let trace: RequestTrace | null = null
    if (route) {
      const req = this.request ?? new ParsedWireRequest(head, this.front.limits.maxJsonDepth, this)
      req.body = r.body
      req.startedAt = startedAt
      let action: WireAction | null
      try {
        action = route.wire(req)
      } catch (err) {
        console.error('wire route failed', err)
        action = { error: internalError() }
      }
      if (action) {
        this.act(head, req, action)
        return
      }
      trace = req.trace
    } else if (r.body.length > 0 && this.tooDeep(r)) {
      this.refuseHead(head, 400, `JSON body nested deeper than ${this.front.limits.maxJsonDepth}`, startedAt)
      return
    }
    this.relay(r, startedAt, route !== undefined, extraHead, trace)
  }

  /** tracing: the listener's telemetry when it is on (null: off). */
  get tracing(): Telemetry | null {
    return this.front.tracing
  }

  /**
   * requestSpan: the server span of a hot request whose route called startTrace: the route's
   * path and model, and what the front knows (method, the client's traceparent, the addresses:
   * `server.*` from the Host the client addressed, else the listener).
   */
  requestSpan(head: RequestHead, route: string, model: string | undefined): RequestTrace | null {
    const front = this.front
    let serverAddress = front.hostname
    let serverPort = front.port
    const host = header(head, 'host')
    if (host) {
      const colon = host.lastIndexOf(':')
      if (colon > host.lastIndexOf(']')) {
        serverAddress = host.slice(0, colon)
        serverPort = Number(host.slice(colon + 1)) || serverPort
      } else serverAddress = host
    }
    return front.tracing!.requestSpan({
      method: head.method,
      route,
      ...(head.path !== route ? { path: head.path } : {}),
      traceparent: header(head, 'traceparent'),
      model,
      clientAddress: this.address,
      serverAddress,
      serverPort,
    })
  }

  /** internalHead: what the internal check can judge from the head (internalRequest without the body). */
  private internalHead(head: RequestHead): InternalHead {
    return {
      method: head.method,
      target: head.target,
      headers: { get: (name) => joinedHeader(head, name) },
      peer: this.address,
    }
  }

  /**
   * internalRequest: what the internal check reads. `target` is the target relayed (the one parse);
   * a header sent more than once reads as its values joined by ", ", as the framework behind reads it.
   */
  private internalRequest(r: ParsedRequest): InternalRequest {
    const head = r.head
    return {
      method: head.method,
      target: head.target,
      headers: { get: (name) => joinedHeader(head, name) },
      body: r.body.bytes(),
      peer: this.address,
    }
  }

  /**
   * answerError writes a complete error response in `shape` (with `extraHead`, a grant's lines); the
   * connection goes on when it may.
   */
  private answerError(
    head: RequestHead,
    error: AppError,
    shape: ErrorShape,
    startedAt: number,
    extraHead = '',
  ): void {
    const keepAlive = head.keepAlive && !this.draining
    this.write(errorResponse(error, shape, keepAlive, extraHead))
    const now = performance.now()
    this.front.opts.onRequest(head.method, head.path, head.query, error.status, now - startedAt)
    this.answered(keepAlive, now)
  }

  /** tooDeep: a body the framework would parse as JSON nests deeper than the listener allows. */
  private tooDeep(r: ParsedRequest): boolean {
    const type = header(r.head, 'content-type')
    return (type === null || JSON_TYPE.test(type)) && r.body.nestedDeeperThan(this.front.limits.maxJsonDepth)
  }

  /** refuseHead answers a complete request with an error in its path's shape and closes the connection. */
  private refuseHead(head: RequestHead, status: number, message: string, startedAt: number): void {
    const error = new AppError(status, REFUSAL_CODES[status] ?? 'BAD_REQUEST', message)
    this.write(errorResponse(error, this.front.opts.shapeOf(head.path), false))
    this.front.opts.onRequest(head.method, head.path, head.query, status, performance.now() - startedAt, true)
    this.closeConnection()
  }

  /**
   * defer holds the request while the route decides (e.g. a model wakes), then acts on what it
   * decided. The connection stays this request's: no idle timeout, pipelined requests wait, and
   * shutdown's drain counts it. A client that leaves aborts the wait; a forward decided after that
   * is ended as 499 at once (its onEnd releases what it holds).
   */
  private defer(
    head: RequestHead,
    req: ParsedWireRequest,
    decide: (signal: AbortSignal) => Promise<WireAction>,
  ): void {
    const abort = new AbortController()
    const waiting: Running = {
      onClientClose: () => abort.abort(),
      onClientDrain: () => {},
    }
    this.current = waiting
    this.startInference()
    const settle = (next: WireAction) => {
      if (this.current !== waiting) {
        // The client went away while the route decided.
        if ('forward' in next)
          next.forward.onEnd({
            status: 499,
            bytes: 0,
            durationMs: 0,
            ttftMs: null,
            streamed: false,
            aborted: true,
          })
        req.trace?.end(499)
        return
      }
      // Hand over without letting the drain count touch zero in between (a forward counts again).
      this.current = null
      this.inference = false
      this.act(head, req, next)
      this.front.inferenceEnded()
    }
    let decided: Promise<WireAction>
    try {
      decided = decide(abort.signal)
    } catch (err) {
      decided = Promise.reject(err)
    }
    decided.then(settle, (err) => {
      console.error('deferred wire route failed', err)
      settle({ error: internalError() })
    })
  }

  private act(head: RequestHead, req: ParsedWireRequest, action: WireAction): void {
    const opts = this.front.opts
    if ('defer' in action) {
      this.defer(head, req, action.defer)
      return
    }
    if ('forward' in action && !action.forward.origin.startsWith('http://')) {
      // Routes forward on the wire only to http:// upstreams (others are left to the framework).
      const f = action.forward
      action = { error: internalError() }
      f.onEnd({ status: 500, bytes: 0, durationMs: 0, ttftMs: null, streamed: false, aborted: false })
    }
    const trace = req.trace
    if ('forward' in action) {
      const f = action.forward
      this.startInference()
      const exchange = new WireExchange(this, {
        head,
        target: f.target,
        upstream: upstreams.origin(f.origin),
        extraHead: f.extraHead ?? '',
        drop: f.dropHeaders,
        body: f.body,
        firstByteTimeoutMs: f.firstByteTimeoutMs,
        connectTimeoutMs: f.connectTimeoutMs,
        errorShape: 'proxy',
        startedAt: req.startedAt,
        responseHead: req.grant?.responseHead,
        // A recording span reads the engine's counts too (when the answer carries them).
        usage: f.usage ?? (trace?.recording ? 'read' : undefined),
        trace,
        onEnd: (info) => {
          opts.onRequest(head.method, head.path, head.query, info.status, info.durationMs)
          f.onEnd(info)
          if (trace) endTrace(trace, info)
        },
      })
      this.current = exchange
      exchange.start()
      return
    }
    if ('error' in action) {
      const error = action.error
      this.answerError(head, error, 'proxy', req.startedAt, req.grant?.responseHead)
      trace?.end(error.status, error.status >= 500 ? error.message : undefined)
      return
    }
    const keepAlive = head.keepAlive && !this.draining
    const status = action.status ?? 200
    trace?.end(status)
    this.write(jsonResponse(status, action.json, keepAlive, undefined, req.grant?.responseHead))
    const now = performance.now()
    opts.onRequest(head.method, head.path, head.query, status, now - req.startedAt)
    this.answered(keepAlive, now)
  }

  /**
   * relay hands the request to the framework's listener and its response back: the target as this
   * front parsed it (origin-form), a canonical Host (never the client's, so the framework's URL and
   * routing see exactly the path parsed here), and the client's address in PEER_HEADER. `hot`: a
   * hot route left this request to the framework (e.g. held while a model wakes): drain waits for it.
   * `extraHead`: lines the internal check added (its token, for an accepted `/internal/` request).
   */
  private relay(
    r: ParsedRequest,
    startedAt: number,
    hot: boolean,
    extraHead: string,
    trace: RequestTrace | null,
  ): void {
    const head = r.head
    if (hot) this.startInference()
    const exchange = new WireExchange(this, {
      head,
      target: head.target,
      upstream: upstreams.unix(this.front.opts.frameworkSocket),
      extraHead: `${PEER_HEADER}: ${this.socket.remoteAddress}\r\n${extraHead}`,
      body: r.body,
      firstByteTimeoutMs: 0,
      connectTimeoutMs: FRAMEWORK_CONNECT_MS,
      errorShape: this.front.opts.shapeOf(head.path),
      startedAt,
      onEnd: trace ? (info) => endTrace(trace, info) : () => {},
    })
    this.current = exchange
    exchange.start()
  }

  private startInference(): void {
    this.inference = true
    this.front.inferenceStarted()
  }

  /** endCurrent: the running exchange is over (done, failed, or its client went away). */
  private endCurrent(): void {
    this.current = null
    if (this.inference) {
      this.inference = false
      this.front.inferenceEnded()
    }
  }

  /**
   * refuse answers what the parser threw (a malformed or oversized request, or a HeadRefusal) and
   * closes the connection, lingering so that a client still sending reads the answer.
   */
  private refuse(err: unknown): void {
    const path = this.parser.pendingHead?.path ?? (this.parser.lastPath || '/')
    let error: AppError
    let shape: ErrorShape
    if (err instanceof HeadRefusal) {
      error = err.error
      shape = err.shape
    } else {
      const status = err instanceof RequestError ? err.status : 400
      const message = err instanceof Error ? err.message : 'Bad request'
      error = new AppError(status, REFUSAL_CODES[status] ?? 'BAD_REQUEST', message)
      shape = this.front.opts.shapeOf(path)
    }
    this.write(errorResponse(error, shape, false))
    this.front.opts.onRequest('-', path, '', error.status, 0, true)
    this.closeConnection(true)
  }

  // WireClient
  get draining(): boolean {
    return this.front.stopped
  }

  write(data: Uint8Array | string): boolean {
    if (this.closed) return false
    if (this.queue !== null) {
      this.queue.push(typeof data === 'string' ? Buffer.from(data, 'latin1') : data)
      return false
    }
    const rest = writeAll(this.socket, data)
    if (!rest) return true
    this.queue = [rest]
    return false
  }

  exchangeDone(reuse: boolean, now: number): void {
    this.endCurrent()
    this.answered(reuse, now)
  }

  /**
   * closeConnection ends the connection once what is queued is written. `linger`: the client may
   * still be sending (an early refusal): half-close and drop what it sends (LINGER_MS), so that it
   * reads the answer instead of a reset.
   */
  closeConnection(linger = false): void {
    this.endCurrent()
    this.release()
    if (linger && !this.closing && !this.closed) this.lingerStart = performance.now()
    this.closing = true
    this.arriving = 0
    if (this.queue === null) this.finish()
  }

  /** finish: the last byte is queued to the socket; close, or half-close and linger. */
  private finish(): void {
    if (this.lingerStart > 0) this.socket.shutdown()
    else this.socket.end()
  }

  /** answered: a response is complete; go on with the next request or close. */
  private answered(reuse: boolean, now: number): void {
    this.lastActive = now
    this.release()
    // A request already arriving behind this response gets its head deadline from now, not from
    // when its first bytes came in while a long response ran.
    this.arriving = this.parser.buffered > 0 ? now : 0
    if (!reuse || this.front.stopped || this.reserve) {
      this.closeConnection()
      return
    }
    if (this.paused) {
      this.paused = false
      this.socket.resume()
    }
    if (this.parser.buffered > 0) this.drive(now)
  }

  onDrain(): void {
    const queue = this.queue
    while (queue !== null && queue.length > 0) {
      const head = queue[0]!
      const n = this.socket.write(head)
      if (n < head.byteLength) {
        queue[0] = head.subarray(Math.max(n, 0))
        return
      }
      queue.shift()
    }
    this.queue = null
    if (this.closing) this.finish()
    else this.current?.onClientDrain()
  }

  onClose(): void {
    if (this.closed) return
    this.closed = true
    this.queue = null
    this.front.conns.delete(this)
    this.front.forget(this.address)
    this.release()
    if (this.reserve) this.front.overflow--
    const running = this.current
    this.endCurrent()
    running?.onClientClose()
  }

  /** onTimeout: Bun's idle timer fired; only a connection idle between requests is closed. */
  onTimeout(): void {
    const idleMs = this.front.opts.idleTimeoutSeconds * 1000
    const quiet = performance.now() - this.lastActive
    if (this.current || quiet < idleMs) {
      this.socket.timeout(Math.max(1, Math.ceil((idleMs - (this.current ? 0 : quiet)) / 1000)))
      return
    }
    this.socket.end()
  }

  /**
   * shutdown: `force` closes now. Otherwise only a connection idle between requests closes now; one
   * with a response running or a request still arriving closes once that is answered (the host's
   * grace period bounds the wait with a forced stop).
   */
  shutdown(force: boolean): void {
    if (force) {
      this.socket.terminate()
      this.onClose()
    } else if (!this.current && this.parser.buffered === 0 && !this.parser.pendingHead) this.closeConnection()
  }
}

/** endTrace ends a request's span with its forward's outcome (the proxy's error code, when it failed). */
function endTrace(trace: RequestTrace, info: ForwardEnd): void {
  const u = info.usage
  if (u || info.finishReasons)
    trace.usage({ inputTokens: u?.prompt, outputTokens: u?.completion, finishReasons: info.finishReasons })
  trace.end(info.status, info.error)
}

/** joinedHeader: every value of the lower-case header `name`, joined by ", " (null when absent). */
function joinedHeader(head: RequestHead, name: string): string | null {
  const f = head.fields
  let out: string | null = null
  for (let k = 0; k < f.length; k += 4)
    if (f[k + 1]! - f[k]! === name.length && nameAt(head.text, f[k]!, name)) {
      const value = head.text.slice(f[k + 2]!, f[k + 3]!)
      out = out === null ? value : `${out}, ${value}`
    }
  return out
}
