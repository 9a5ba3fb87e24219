import type { RequestTrace } from '../host/telemetry/spans.ts'
import type { Telemetry } from '../host/telemetry/telemetry.ts'
import { AppError, type ErrorShape, inferenceShape, internalError } from '../http/errors.ts'
import { Connection, HeadRefusal, REFUSAL_CODES, type Running, refusal } from './connection.ts'
import { WireExchange } from './exchange.ts'
import { PEER_HEADER } from './headers.ts'
import { upstreams } from './pool.ts'
import { header, type ParsedRequest, type RequestHead } from './request-parser.ts'
import { errorResponse, jsonResponse } from './responses.ts'
import type { ForwardEnd, WireAction } from './route.ts'
import { internalHead, internalRequest, ParsedWireRequest } from './wire-request.ts'

/** Relays to the framework's own socket: connect deadline (it is local), no first-byte deadline. */
const FRAMEWORK_CONNECT_MS = 5000

/** Content types whose body the framework parses as JSON (and an absent one, which it may sniff). */
const JSON_TYPE = /json/i

/**
 * ClientConn: a client connection of the wire front (Connection, connection.ts) with what the
 * front does with each request on it: judge its head before any body byte is read (admit), then
 * answer it once complete (handle): the internal check of an `/internal/` request, the hot route's
 * action (an error, a JSON reply, a forward socket to socket, a decision deferred while a model
 * wakes), or the relay to the framework; and end the request's span with its response.
 */
export class ClientConn extends Connection {
  /** The hot request whose head was admitted (its body is arriving or complete). */
  private request: ParsedWireRequest | null = null

  /**
   * admit is the head stage, run the moment a head is complete, before any byte of its body is
   * read: what a reserve connection may ask, the internal check of what can come from a peer, the
   * hot route's guard (the inference key) and admission, and the body's room in the listener's
   * budget. Returns the body limit; a refusal is thrown (HeadRefusal) and the body never read.
   */
  protected override admit(head: RequestHead): number {
    const front = this.front
    const limits = front.limits
    this.route = undefined
    this.request = null
    const shape = front.opts.shapeOf(head.path)
    if (this.reserve && !limits.alwaysServe(head.path))
      throw new HeadRefusal(refusal(503, 'The listener is at its connection limit; retry later', 1), shape)
    let limit = limits.relayBodyBytes
    if (front.opts.internal !== undefined && head.path.startsWith('/internal/')) {
      const denied = front.opts.internalHead?.(internalHead(head, this.address)) ?? null
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
        if (guarded instanceof AppError) throw new HeadRefusal(guarded, inferenceShape(head.path))
        req.grant = guarded
        const admission = route.admit?.(req) ?? null
        if (admission instanceof AppError) throw new HeadRefusal(admission, inferenceShape(head.path))
        if (admission !== null && admission !== 'anonymous') req.grant = admission
        this.route = route
        this.request = req
        limit = admission === 'anonymous' ? limits.relayBodyBytes : Number.POSITIVE_INFINITY
      }
    }
    this.hold(head.chunked ? 0 : Math.max(0, head.contentLength), head.path)
    return limit
  }

  /** handle runs one complete request; `startedAt` is performance.now() when it was complete. */
  protected override handle(r: ParsedRequest, startedAt: number): void {
    const head = r.head
    this.http10 = head.http10
    const vet = this.front.opts.internal
    const internal = vet !== undefined && head.path.startsWith('/internal/')
    let extraHead = ''
    if (internal) {
      let vetted: { error: AppError } | { extraHead: string }
      try {
        vetted = vet(internalRequest(r, this.address))
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
    return front.tracing!.requestSpan({
      method: head.method,
      route,
      path: head.path !== route ? head.path : undefined,
      traceparent: header(head, 'traceparent'),
      model,
      clientAddress: this.address,
      serverAddress: front.hostname,
      serverPort: front.port,
      host: header(head, 'host'),
    })
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
    this.front.opts.onRequest(head.method, head.path, head.query, error.statusIn(shape), now - startedAt)
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
    const shape = this.front.opts.shapeOf(head.path)
    this.write(errorResponse(error, shape, false))
    this.front.opts.onRequest(
      head.method,
      head.path,
      head.query,
      error.statusIn(shape),
      performance.now() - startedAt,
      true,
    )
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
      this.handOver(head, req, next)
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
        errorShape: inferenceShape(head.path),
        startedAt: req.startedAt,
        responseHead: req.grant?.responseHead,
        // A recording span reads the engine's counts too (when the answer carries them).
        usage: f.usage ?? (trace?.recording ? 'read' : undefined),
        retry: f.retry,
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
      this.answerError(head, error, inferenceShape(head.path), req.startedAt, req.grant?.responseHead)
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

  /** retried: the forward's upstream refused it unsent: the route's next action for the same request. */
  retried(action: WireAction): void {
    const req = this.request
    if (req === null) {
      // Cannot happen (only a hot route's forward retries): answer rather than hang.
      this.current = null
      this.closeConnection()
      return
    }
    this.handOver(req.head, req, action)
  }

  /**
   * handOver: the request's running stage (a wait, or a forward that was refused unsent) is over and
   * `action` takes its place, without letting the drain count touch zero in between (a forward
   * counts again).
   */
  private handOver(head: RequestHead, req: ParsedWireRequest, action: WireAction): void {
    this.current = null
    this.inference = false
    this.act(head, req, action)
    this.front.inferenceEnded()
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
}

/** endTrace ends a request's span with its forward's outcome (the proxy's error code, when it failed). */
function endTrace(trace: RequestTrace, info: ForwardEnd): void {
  const u = info.usage
  if (trace.recording && (u || info.finishReasons))
    trace.usage({ inputTokens: u?.prompt, outputTokens: u?.completion, finishReasons: info.finishReasons })
  trace.end(info.status, info.error)
}
