import type { AppError } from '../http/errors.ts'
import { clientResponseInit, connectionTokens, SKIP_REQUEST } from './headers.ts'
import { type ParserEvents, type ResponseHead, ResponseParser } from './http1-parser.ts'
import {
  type Conn,
  type ConnUser,
  codedError,
  connect,
  release,
  type Target,
  takeIdle,
  targetOf,
  writeAll,
} from './http1-pool.ts'
import { type PipeHooks, sseErrorEnding } from './stream.ts'
import type { UpstreamCall, UpstreamReply, UpstreamRequest } from './upstream.ts'

/**
 * http1Send: the proxy's HTTP/1.1 client for `http://` upstreams, on Bun's TCP sockets in the
 * event loop (no request cap, no thread hop). Keep-alive connections are pooled per origin.
 *
 * - The request goes out in one write: request line, Host, the given headers, Content-Length, body.
 * - The reply resolves at the response head; its body is then read whole (`readAll`) or written
 *   straight to the client connection as it arrives (a direct stream), pausing the socket while
 *   that connection is full, so a slow client puts TCP backpressure on the engine instead of
 *   growing memory.
 * - Aborting the call or cancelling the stream closes the socket at once: the engine sees the
 *   disconnect and stops generating.
 * - Hop-by-hop headers are skipped while writing the request and reading the response.
 * - Connections come from http1-pool.ts; a reused connection that closes before any reply byte
 *   is retried once on a new connection.
 */
/** requestBytes serialises the request once (it is resent as is on a retry). */
function requestBytes(req: UpstreamRequest, target: Target, path: string): Buffer | string {
  let head = `${req.method} ${path} HTTP/1.1\r\n${target.hostLine}`
  const extra = connectionTokens(req.headers.get('connection'))
  req.headers.forEach((value, name) => {
    if (SKIP_REQUEST.has(name) || (extra.length > 0 && extra.includes(name))) return
    head += `${name}: ${value}\r\n`
  })
  const body = req.body
  const m = req.method
  if (body && body.byteLength > 0) head += `content-length: ${body.byteLength}\r\n\r\n`
  else if (m === 'POST' || m === 'PUT' || m === 'PATCH') head += 'content-length: 0\r\n\r\n'
  else head += '\r\n'
  // Header text is bytes as received (latin1); a string write would encode it as UTF-8.
  const ascii = !NON_ASCII.test(head)
  if (!body || body.byteLength === 0) return ascii ? head : Buffer.from(head, 'latin1')
  const out = Buffer.allocUnsafe(head.length + body.byteLength)
  out.write(head, 0, 'latin1')
  out.set(body, head.length)
  return out
}

const NON_ASCII = /[^\x00-\x7f]/

export function http1Send(req: UpstreamRequest): UpstreamCall {
  const { target, path } = targetOf(req.url)
  let exchange!: Exchange
  const reply = new Promise<UpstreamReply>((resolve, reject) => {
    exchange = new Exchange(req, target, requestBytes(req, target, path), resolve, reject)
  })
  exchange.start()
  return { reply, abort: (reason) => exchange.abort(reason) }
}

type Mode = 'queue' | 'buffer' | 'stream'

class Exchange implements UpstreamReply, ConnUser, ParserEvents {
  status = 0
  contentType: string | null = null
  length = -1
  hasBody = false

  private conn: Conn | null = null
  private parser!: ResponseParser
  private response: ResponseHead | null = null
  private received = 0
  private unwritten: Uint8Array | null = null
  private retried = false
  private ended = false
  private failure: unknown = null
  private mode: Mode = 'queue'
  private queue: Uint8Array[] = []
  private buffered: { resolve(b: Uint8Array<ArrayBuffer> | null): void; reject(e: unknown): void } | null =
    null
  // stream mode
  private controller: ReadableStreamDirectController | null = null
  private hooks: PipeHooks | null = null
  private progress: { bytes: number } | null = null
  private finished = false
  private paused = false
  private first = true
  private last = 10
  private beforeLast = 10

  constructor(
    private readonly req: UpstreamRequest,
    private readonly target: Target,
    private readonly bytes: Buffer | string,
    private readonly resolveHead: (r: UpstreamReply) => void,
    private readonly rejectHead: (e: unknown) => void,
  ) {}

  private aborted = false

  start(): void {
    const conn = takeIdle(this.target.key)
    if (conn) this.attach(conn)
    else this.open()
  }

  private open(): void {
    connect(this.target, this.req.connectTimeoutMs).then(
      (conn) => {
        if (this.aborted || this.failure) return conn.destroy()
        this.attach(conn)
      },
      (err) => this.fail(err),
    )
  }

  private attach(conn: Conn): void {
    this.conn = conn
    conn.user = this
    this.received = 0
    this.parser = new ResponseParser(this, this.req.method === 'HEAD')
    this.write(this.bytes)
  }

  private write(data: Uint8Array | string): void {
    this.unwritten = writeAll(this.conn!.socket!, data)
  }

  onDrain(): void {
    if (this.unwritten) this.write(this.unwritten)
  }

  onData(data: Buffer): void {
    this.received += data.length
    try {
      this.parser.feed(data)
    } catch (err) {
      this.conn?.destroy()
      this.fail(err)
    }
  }

  onClose(conn: Conn): void {
    if (conn !== this.conn || this.ended) return
    if (this.parser.closed()) return
    // A reused connection the server had closed meanwhile: nothing was processed, send again.
    if (conn.served && this.received === 0 && !this.retried && !this.aborted) {
      this.retried = true
      this.conn = null
      this.open()
      return
    }
    this.fail(codedError('ConnectionClosed', 'the upstream closed the connection'))
  }

  abort(reason: unknown): void {
    if (this.aborted) return
    this.aborted = true
    if (!this.ended) this.conn?.destroy()
    this.fail(reason ?? codedError('AbortError', 'aborted'))
  }

  clientHeaders(): HeadersInit {
    return clientResponseInit(this.response!.headers, this.response!.connection)
  }

  // ParserEvents (the exchange is its parser's listener: no closures per request).
  head(head: ResponseHead): void {
    this.response = head
    this.status = head.status
    this.contentType = head.contentType
    this.length = head.length
    this.hasBody = head.framing !== 'none'
    this.resolveHead(this)
  }

  body(buf: Buffer, start: number, end: number): void {
    const piece = buf.subarray(start, end)
    if (this.mode === 'stream') this.push(piece)
    else this.queue.push(piece)
  }

  end(): void {
    this.ended = true
    const conn = this.conn!
    conn.served = true
    // A socket paused for a slow client is never pooled: nothing would resume it for the next request.
    if (this.response!.keepAlive && !this.unwritten && !this.parser.trailingBytes && !this.paused)
      release(conn)
    else conn.destroy()
    if (this.mode === 'buffer') this.buffered!.resolve(this.concat())
    else if (this.mode === 'stream') this.close()
  }

  private fail(err: unknown): void {
    if (this.ended || this.failure) return
    this.failure = err
    if (!this.response) this.rejectHead(err)
    else if (this.mode === 'buffer') this.buffered!.reject(err)
    else if (this.mode === 'stream') this.error(err)
  }

  readAll(): Promise<Uint8Array<ArrayBuffer> | null> {
    this.mode = 'buffer'
    if (this.ended) return Promise.resolve(this.concat())
    if (this.failure) return Promise.reject(this.failure)
    return new Promise((resolve, reject) => {
      this.buffered = { resolve, reject }
    })
  }

  private concat(): Uint8Array<ArrayBuffer> | null {
    const q = this.queue
    this.queue = []
    if (q.length === 0) return this.hasBody ? new Uint8Array(0) : null
    if (q.length === 1) return q[0] as Uint8Array<ArrayBuffer>
    return Buffer.concat(q) as Uint8Array<ArrayBuffer>
  }

  /**
   * stream hands the body to the listener as a direct stream: each piece the socket delivers is
   * written straight to the client connection (no queue, no promise per chunk). When that
   * connection's buffer is full, write returns a promise: the upstream socket is paused until it
   * drains, so TCP backpressure reaches the engine.
   */
  stream(progress: { bytes: number }, hooks: PipeHooks): ReadableStream<Uint8Array> {
    this.mode = 'stream'
    this.hooks = hooks
    this.progress = progress
    const source: Bun.DirectUnderlyingSource<Uint8Array> = {
      type: 'direct',
      pull: (controller) => {
        // Called once by the listener; the stream stays open until close().
        this.controller = controller
        const queued = this.queue
        this.queue = []
        for (const piece of queued) this.push(piece)
        if (this.ended) this.close()
        else if (this.failure) this.error(this.failure)
      },
      cancel: () => this.cancelled(),
    }
    return new ReadableStream(source as never) as ReadableStream<Uint8Array>
  }

  /** cancelled: the client went away. */
  private cancelled(): void {
    if (!this.finished) {
      this.finished = true
      this.hooks!.onCancel()
      this.hooks!.onDone(null)
    }
    if (!this.ended) this.conn?.destroy()
  }

  private push(piece: Uint8Array): void {
    const n = piece.byteLength
    if (n === 0 || this.finished) return
    const c = this.controller
    if (!c) {
      this.queue.push(piece)
      return
    }
    if (this.first) {
      this.first = false
      this.hooks!.onFirstChunk()
    }
    this.progress!.bytes += n
    this.beforeLast = n > 1 ? piece[n - 2]! : this.last
    this.last = piece[n - 1]!
    const written = c.write(piece)
    if (typeof written === 'number') {
      if (written === 0) this.cancelled()
      return
    }
    // The client connection is full: stop reading the engine until it drains.
    if (!this.paused) {
      this.paused = true
      this.conn?.socket?.pause()
      written.then(this.drained, this.drained)
    }
  }

  private readonly drained = () => {
    if (!this.paused) return
    this.paused = false
    if (!this.finished && !this.ended) this.conn?.socket?.resume()
  }

  private close(): void {
    if (this.finished || !this.controller) return
    this.finished = true
    this.hooks!.onDone(null)
    this.controller.close()
  }

  private error(cause: unknown): void {
    if (this.finished) return
    const hooks = this.hooks!
    const c = this.controller
    if (!c) {
      // Never pulled (the client is gone, or never read): still report the end, so the lease is released.
      this.finished = true
      hooks.onDone(hooks.failure(cause))
      return
    }
    this.finished = true
    const error: AppError = hooks.failure(cause)
    hooks.onDone(error)
    try {
      if (hooks.sse) {
        c.write(sseErrorEnding(error, this.last, this.beforeLast))
        c.close()
      } else c.close(cause instanceof Error ? cause : new Error(String(cause)))
    } catch {
      // the client went away meanwhile
    }
  }
}
