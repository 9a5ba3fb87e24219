import type { Socket } from 'bun'
import type { Telemetry } from '../host/telemetry/telemetry.ts'
import { AppError, type ErrorShape, inferenceShape } from '../http/errors.ts'
import type { WireClient } from './exchange.ts'
import { type FrontLimits, type FrontOptions, HEAD_BYTES } from './front-options.ts'
import { writeAll } from './pool.ts'
import { type ParsedRequest, RequestError, type RequestHead, RequestParser } from './request-parser.ts'
import { errorResponse } from './responses.ts'
import type { WireRoute } from './route.ts'
import type { Waiting, WaitList } from './waiting.ts'

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

export const REFUSAL_CODES: Record<number, string> = {
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
export function refusal(status: number, message: string, retryAfterSeconds?: number): AppError {
  const headers: Record<string, string> = retryAfterSeconds
    ? { 'retry-after': String(retryAfterSeconds) }
    : {}
  return new AppError(status, REFUSAL_CODES[status] ?? 'BAD_REQUEST', message, undefined, undefined, headers)
}

/** Running: what a client connection waits on while a request is answered. */
export interface Running {
  /** The client's connection closed: stop, and release what is held. */
  onClientClose(): void
  /** The client's connection can take more bytes. */
  onClientDrain(): void
}

/**
 * HeadRefusal: a request refused from its head (its key, its size against what is left, a reserve
 * connection asking for more than health), thrown out of the parser's head callback before any
 * body byte is read, and answered in `shape`.
 */
export class HeadRefusal extends Error {
  constructor(
    readonly error: AppError,
    readonly shape: ErrorShape,
  ) {
    super(error.message)
  }
}

/**
 * ConnFront: what a client connection uses of its listener (WireFront, server.ts): its options and
 * limits, the budgets and counts it takes part in, the route table. An interface, so that the
 * listener can make connections without the two files importing each other.
 */
export interface ConnFront {
  readonly opts: FrontOptions
  readonly limits: FrontLimits
  readonly conns: Set<Connection>
  readonly tracing: Telemetry | null
  readonly hostname: string
  readonly port: number
  readonly stopped: boolean
  /**
   * Connections that have not completed a request head since they opened (silent, or a first head
   * arriving), oldest first: the ones shed first under pressure.
   */
  readonly fresh: WaitList
  /** Keep-alive connections between requests (no complete head since their last answer), oldest first. */
  readonly idle: WaitList
  overflow: number
  bufferedBodyBytes: number
  unverifiedInternal: number
  match(path: string, method: string): WireRoute | undefined
  forget(address: string): void
  inferenceStarted(): void
  inferenceEnded(): void
}

/**
 * Connection: one client connection of the wire front, as a state machine over its socket: bytes
 * read into the strict parser and requests driven one at a time (pipelined ones wait), writes queued
 * under backpressure, the arrival clocks (head deadline, body rate, reserve), keep-alive or close
 * after each answer, the lingering close after a refusal, the idle timeout, and the listener's
 * budgets it holds. What is done with a request is its subclass's (ClientConn, dispatch.ts):
 * `admit` judges a head the moment it is complete, `handle` answers a complete request. A subclass
 * rather than a second object: a connection stays one object, with no hop between the two halves
 * on the hot path.
 */
export abstract class Connection implements WireClient, Waiting {
  waitPrev: Waiting | null = null
  waitNext: Waiting | null = null
  waitList: WaitList | null = null
  waitingSince = 0
  private readonly parser: RequestParser
  /** What runs for the request being answered: an exchange, or a deferred decision (Waiting). */
  protected current: Running | null = null
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
  protected inference = false
  /** The hot route of the head the parser read last (admitted then; handle reuses it). */
  protected route: WireRoute | undefined = undefined
  /** Body bytes this connection holds against the listener's maxBufferedBodyBytes. */
  private held = 0
  /** The request now arriving is an `/internal/` one counted in the front's unverifiedInternal. */
  protected unverified = false
  /** performance.now() when a lingering close began (0: not lingering). */
  private lingerStart = 0
  http10 = false
  /** Responses completed on this connection (0: it never had a complete head answered). */
  private answers = 0

  constructor(
    protected readonly front: ConnFront,
    protected readonly socket: Socket<Connection>,
    /** reserve: accepted past the listener's cap; serves one request for an alwaysServe path. */
    protected readonly reserve: boolean,
    /** The client's address, as counted in the front's per-address map. */
    protected readonly address: string,
  ) {
    this.parser = new RequestParser({
      maxHeadBytes: HEAD_BYTES,
      ...front.opts.limits,
      bodyLimit: (head) => {
        // A complete head: the connection is no longer waiting, and is not shed under pressure.
        this.waitList?.remove(this)
        return this.admit(head)
      },
    })
    // A connection's first head is due from when it opened: one that never sends a byte is cut at
    // the head deadline like a slow one, instead of being held until the idle timeout.
    this.arriving = this.lastActive
  }

  /** admit: the head stage (see ClientConn.admit); returns the body limit or throws a HeadRefusal. */
  protected abstract admit(head: RequestHead): number

  /** handle: the request stage (see ClientConn.handle), for each complete request in turn. */
  protected abstract handle(r: ParsedRequest, startedAt: number): void

  /**
   * hold counts `bytes` of body held by this connection (the Content-Length from the head, or what a
   * chunked body has grown to) against the listener's budget; past it, 503 before more is read.
   */
  protected hold(bytes: number, path: string): void {
    const extra = bytes - this.held
    if (extra <= 0) return
    const front = this.front
    if (front.bufferedBodyBytes + extra > front.limits.maxBufferedBodyBytes) {
      const error = refusal(503, 'The server holds as many request bodies as it may; retry later', 1)
      throw new HeadRefusal(
        error,
        this.route && !path.startsWith('/internal/') ? inferenceShape(path) : front.opts.shapeOf(path),
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

  /**
   * shed: the front cuts this waiting connection (no complete head since it opened or since its
   * last answer) to make room under pressure. A keep-alive connection that has sent nothing since
   * its answer is ended (a FIN, as a keep-alive close always may come); any other is reset, so its
   * descriptor is free at once. Either way it leaves the listener's counts now.
   */
  shed(): void {
    this.waitList?.remove(this)
    this.closing = true
    this.arriving = 0
    if (this.answers > 0 && this.parser.buffered === 0) this.socket.end()
    else this.socket.terminate()
    this.onClose()
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

  protected startInference(): void {
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
    const pending = this.parser.pendingHead
    const path = pending?.path ?? (this.parser.lastPath || '/')
    // The method as sent once its request line was read ('-': none yet, or no token).
    const method = pending?.method ?? (this.parser.lastMethod || '-')
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
    this.front.opts.onRequest(method, path, '', error.statusIn(shape), 0, true)
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
    this.waitList?.remove(this)
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
  protected answered(reuse: boolean, now: number): void {
    this.lastActive = now
    this.release()
    // A request already arriving behind this response gets its head deadline from now, not from
    // when its first bytes came in while a long response ran.
    this.arriving = this.parser.buffered > 0 ? now : 0
    this.answers++
    if (!reuse || this.front.stopped || this.reserve) {
      this.closeConnection()
      return
    }
    // Waiting for its next head from now: in the keep-alive list until one is complete.
    this.front.idle.add(this, now)
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
    this.waitList?.remove(this)
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
