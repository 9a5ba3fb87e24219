import type { Socket, TCPSocketListener } from 'bun'
import type { InternalRequest } from '../http/auth.ts'
import { AppError, type ErrorShape, internalError } from '../http/errors.ts'
import type { BodyRange } from './body-range.ts'
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
import type { WireAction, WireRequest } from './route.ts'

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
   * guard runs before a hot route answers (the inference API key); an error is sent as is. Hot
   * routes under `/internal/` answer to `internal` instead.
   */
  guard?: (req: WireRequest) => AppError | null
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
  /** Called for each request answered on the wire (relayed ones are logged by the framework). */
  onRequest(method: string, path: string, query: string, status: number, ms: number): void
  limits?: Partial<ParserLimits>
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
  /** Open client connections; beyond it (and the reserve) a new connection is closed at once. */
  maxConnections: number
  /**
   * Connections accepted past maxConnections that may only ask for `alwaysServe` paths (health),
   * one request each; anything else gets 503. Keeps a probe working while the listener is full.
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
  reserveConnections: 32,
  relayBodyBytes: 16 * 1024 * 1024,
  maxJsonDepth: 64,
  alwaysServe: (path: string) => path === '/api/health' || path.startsWith('/api/health/'),
})

/** How often the front looks for requests that are arriving too slowly. */
const SWEEP_MS = 1000

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
  /** Requests running that drain waits for: forwards to engines and hot routes left to the framework. */
  private inflight = 0
  private drainWaiters: (() => void)[] = []
  private readonly sweeper: Timer
  private stopping = false

  constructor(readonly opts: FrontOptions) {
    const front = this
    this.limits = { ...DEFAULT_FRONT_LIMITS, ...opts.front }
    const limits = this.limits
    this.listener = Bun.listen<ClientConn>({
      hostname: opts.hostname,
      port: opts.port,
      socket: {
        open(s) {
          // Past the cap, close before reading anything: accept() never meets the fd limit, so the
          // process never spins on it, and connections already open keep being served.
          const full = front.conns.size >= limits.maxConnections
          if (full && front.overflow >= limits.reserveConnections) {
            front.rejected++
            s.terminate()
            return
          }
          s.data = new ClientConn(front, s, full)
          front.conns.add(s.data)
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

class ParsedWireRequest implements WireRequest {
  private scanned: ScannedJson | ScanFailure | undefined = undefined

  constructor(
    private readonly head: RequestHead,
    readonly body: BodyRange,
    readonly startedAt: number,
    private readonly maxJsonDepth: number,
  ) {}

  json(): ScannedJson | ScanFailure {
    this.scanned ??= this.body.scanJson(this.maxJsonDepth)
    return this.scanned
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
  /** The hot route of the head the parser read last (bodyLimit matched it; handle reuses it). */
  private route: WireRoute | undefined = undefined
  http10 = false

  constructor(
    private readonly front: WireFront,
    private readonly socket: Socket<ClientConn>,
    /** reserve: accepted past the listener's cap; serves one request for an alwaysServe path. */
    private readonly reserve: boolean,
  ) {
    const relayBody = front.limits.relayBodyBytes
    this.parser = new RequestParser({
      ...front.opts.limits,
      // A body the framework will parse gets the smaller limit, refused from the head alone.
      bodyLimit: (head) => {
        this.route = front.match(head.path, head.method)
        return this.route ? Number.POSITIVE_INFINITY : relayBody
      },
    })
  }

  onData(data: Buffer): void {
    if (this.closing) return
    // One clock reading serves as the connection's last activity and the request's start.
    const now = performance.now()
    this.lastActive = now
    if (this.arriving === 0 && !this.current) this.arriving = now
    this.parser.push(data)
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
    if (this.arriving === 0 || this.current || this.closing) return
    const { headTimeoutMs, minBodyBytesPerSecond } = this.front.limits
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
    if (this.reserve && !this.front.limits.alwaysServe(head.path)) {
      this.refuseHead(head, 503, 'The listener is at its connection limit; retry later', startedAt)
      return
    }
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
      if ('error' in vetted) {
        this.answerError(head, vetted.error, this.front.opts.shapeOf(head.path), startedAt)
        return
      }
      extraHead = vetted.extraHead
    }
    // Matched once, when the parser asked for this head's body limit.
    const route = this.route
    if (route) {
      const req = new ParsedWireRequest(head, r.body, startedAt, this.front.limits.maxJsonDepth)
      let action: WireAction | null
      try {
        const denied = internal ? null : this.front.opts.guard?.(req)
        action = denied ? { error: denied } : route.wire(req)
      } catch (err) {
        console.error('wire route failed', err)
        action = { error: internalError() }
      }
      if (action) {
        this.act(head, req, action)
        return
      }
    } else if (r.body.length > 0 && this.tooDeep(r)) {
      this.refuseHead(head, 400, `JSON body nested deeper than ${this.front.limits.maxJsonDepth}`, startedAt)
      return
    }
    this.relay(r, startedAt, route !== undefined, extraHead)
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
      peer: this.socket.remoteAddress,
    }
  }

  /** answerError writes a complete error response in `shape`; the connection goes on when it may. */
  private answerError(head: RequestHead, error: AppError, shape: ErrorShape, startedAt: number): void {
    const keepAlive = head.keepAlive && !this.draining
    this.write(errorResponse(error, shape, keepAlive))
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
    this.front.opts.onRequest(head.method, head.path, head.query, status, performance.now() - startedAt)
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
        onEnd: (info) => {
          opts.onRequest(head.method, head.path, head.query, info.status, info.durationMs)
          f.onEnd(info)
        },
      })
      this.current = exchange
      exchange.start()
      return
    }
    if ('error' in action) {
      this.answerError(head, action.error, 'proxy', req.startedAt)
      return
    }
    const keepAlive = head.keepAlive && !this.draining
    const status = action.status ?? 200
    this.write(jsonResponse(status, action.json, keepAlive))
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
  private relay(r: ParsedRequest, startedAt: number, hot: boolean, extraHead: string): void {
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
      onEnd: () => {},
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

  private refuse(err: unknown): void {
    const status = err instanceof RequestError ? err.status : 400
    const message = err instanceof Error ? err.message : 'Bad request'
    const path = this.parser.pendingHead?.path ?? (this.parser.lastPath || '/')
    const error = new AppError(status, REFUSAL_CODES[status] ?? 'BAD_REQUEST', message)
    this.write(errorResponse(error, this.front.opts.shapeOf(path), false))
    this.front.opts.onRequest('-', path, '', status, 0)
    this.closeConnection()
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

  closeConnection(): void {
    this.endCurrent()
    this.closing = true
    this.arriving = 0
    if (this.queue === null) this.socket.end()
  }

  /** answered: a response is complete; go on with the next request or close. */
  private answered(reuse: boolean, now: number): void {
    this.lastActive = now
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
    if (this.closing) this.socket.end()
    else this.current?.onClientDrain()
  }

  onClose(): void {
    if (this.closed) return
    this.closed = true
    this.queue = null
    this.front.conns.delete(this)
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
