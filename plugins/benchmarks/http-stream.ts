import { type Conn, type ConnUser, Pool, type Target, writeAll } from '../../src/wire/pool.ts'
import { type ParserEvents, type ResponseHead, ResponseParser } from '../../src/wire/response-parser.ts'
import { type InboxTarget, inbox } from './inbox.ts'
import { errorMessage } from './sse-scan.ts'

/**
 * HttpStreamClient is the benchmark runner's side of modelgate's one HTTP/1.1 client: connections
 * come from a connection pool of src/wire/pool.ts (the proxy's, with its keep-alive reuse rules,
 * connect deadline and TLS), responses are framed by the proxy's ResponseParser (interim 1xx
 * skipped; chunked, content-length or close-delimited bodies). What the runner adds is timing:
 * `fetch` queues beyond a fixed number of simultaneous requests per process and adds a promise per
 * body read; here every socket read is stamped with `performance.now()` in the socket's data
 * callback and parsed from the Inbox, body text going straight to the SSE scanner.
 *
 * Each client (one per benchmark) has its own pool, so warmup leaves open connections behind for
 * the measured phase (as aiohttp's pool does for `vllm bench serve`), and `close` ends them all.
 */

/** StreamCallbacks receive one response: body text as it arrives, then `end` exactly once. */
export interface StreamCallbacks {
  /** body receives latin1 text of the (de-chunked) response body of a 2xx response. */
  body(text: string, at: number): void
  /** end: the response is complete (`status` 0 when nothing was received). */
  end(status: number, errorText: string | null, at: number): void
}

/** A connect that takes longer fails the request (the run's request timeout may be longer). */
const CONNECT_TIMEOUT_MS = 10_000
/** An error body is kept up to this many characters for its message. */
const ERROR_BODY_MAX = 4096

/** StreamExchange is one request: its connection's events, stamped on arrival and parsed from the inbox. */
class StreamExchange implements ConnUser, ParserEvents, InboxTarget {
  finished = false
  private conn: Conn | null = null
  private parser: ResponseParser | null = null
  private status = 0
  private keepAlive = true
  private errorBody = ''
  private received = false
  private retried = false
  /** reused: the connection had carried a request before (a close before any byte may be stale reuse). */
  private reused = false
  /** The arrival time of the bytes being parsed, for the body events they produce. */
  private at = 0
  private unsent: Uint8Array | null = null

  constructor(
    private readonly target: Target,
    private readonly payload: Uint8Array,
    private readonly cb: StreamCallbacks,
    private readonly onFinish: (x: StreamExchange) => void,
  ) {}

  start(): void {
    const conn = this.target.pool.takeIdle(this.target)
    if (conn) this.attach(conn)
    else this.open()
  }

  private open(): void {
    this.target.pool.connect(this.target, CONNECT_TIMEOUT_MS).then(
      (conn) => {
        // Aborted while connecting: the fresh connection serves the next request.
        if (this.finished) conn.release()
        else this.attach(conn)
      },
      (err: unknown) => this.finish(0, err instanceof Error ? err.message : String(err), performance.now()),
    )
  }

  private attach(conn: Conn): void {
    this.conn = conn
    this.reused = conn.served
    conn.user = this
    this.parser = new ResponseParser(this, false)
    this.status = 0
    this.errorBody = ''
    this.received = false
    this.unsent = writeAll(conn.socket!, this.payload)
  }

  // ConnUser: socket events, in the socket callbacks. Only the arrival time is taken here.
  onData(data: Buffer): void {
    inbox.data(this, data, performance.now())
  }

  onDrain(): void {
    const socket = this.conn?.socket
    if (this.unsent && socket) this.unsent = writeAll(socket, this.unsent)
  }

  onClose(conn: Conn, err?: Error): void {
    if (conn === this.conn) inbox.close(this, err)
  }

  // InboxTarget: the same events, in arrival order, once the loop has stamped a batch.
  read(data: Buffer, at: number): void {
    const parser = this.parser
    if (!parser) return
    this.received = true
    this.at = at
    try {
      parser.feed(data)
    } catch (err) {
      this.conn?.destroy()
      this.finish(this.status, err instanceof Error ? err.message : String(err), at)
      return
    }
    // Bytes after the end of the response: the connection cannot carry another one.
    if (parser.done) this.complete(at, !parser.trailingBytes)
  }

  hangup(err?: Error): void {
    const at = performance.now()
    this.conn = null
    // A reused connection the server had closed meanwhile: nothing was processed, send again.
    if (!this.received && this.reused && !this.retried && (err as { code?: string })?.code !== 'PoolClosed') {
      this.retried = true
      this.parser = null
      this.open()
      return
    }
    // A close-delimited body ends with the close.
    const error = this.parser?.closed()
      ? this.errorText()
      : (err?.message ?? (this.received ? 'connection closed mid-response' : 'connection closed'))
    this.finish(this.status, error, at)
  }

  /** abort ends the request at once (its connection is closed, never reused). */
  abort(message: string): void {
    if (this.finished) return
    this.conn?.destroy()
    this.conn = null
    this.finish(0, message, performance.now())
  }

  // ParserEvents: the response.
  head(h: ResponseHead): void {
    this.status = h.status
    this.keepAlive = h.keepAlive
  }

  body(buf: Buffer, start: number, end: number): void {
    if (this.ok) this.cb.body(buf.toString('latin1', start, end), this.at)
    else if (this.errorBody.length < ERROR_BODY_MAX) this.errorBody += buf.toString('latin1', start, end)
  }

  /** end: the parser saw the response end; it is completed once the read is parsed (see read). */
  end(): void {}

  private complete(at: number, reusable: boolean): void {
    const conn = this.conn
    this.conn = null
    if (conn) {
      conn.served = true
      if (reusable && this.keepAlive) conn.release(at)
      else conn.destroy()
    }
    this.finish(this.status, this.errorText(), at)
  }

  private finish(status: number, errorText: string | null, at: number): void {
    if (this.finished) return
    this.finished = true
    this.parser = null
    this.onFinish(this)
    this.cb.end(status, errorText, at)
  }

  private get ok(): boolean {
    return this.status >= 200 && this.status < 300
  }

  /** errorText: null for a 2xx response, else the engine's message from the error body. */
  private errorText(): string | null {
    return this.ok ? null : errorMessage(this.errorBody || `HTTP ${this.status}`)
  }
}

export class HttpStreamClient {
  private readonly pool: Pool
  private readonly running = new Set<StreamExchange>()
  private closed = false
  private readonly forget = (x: StreamExchange) => this.running.delete(x)

  /**
   * `ca`: PEM certificates trusted for `https:` targets instead of the system's; `serverName`: the
   * name their certificates are checked against instead of the URL's host (PoolOptions).
   */
  constructor(opts: { ca?: string | string[]; serverName?: string } = {}) {
    this.pool = new Pool({ maxIdlePerOrigin: Number.POSITIVE_INFINITY, ...opts })
  }

  /**
   * request sends one request (`payload` from encodeRequest) to `url`'s origin; callbacks fire from
   * socket events, `end` exactly once. Returns an abort function.
   */
  request(url: URL, payload: Uint8Array, callbacks: StreamCallbacks): (reason: string) => void {
    const x = new StreamExchange(this.pool.origin(url.origin), payload, callbacks, this.forget)
    if (this.closed) {
      callbacks.end(0, 'client closed', performance.now())
      return () => {}
    }
    this.running.add(x)
    x.start()
    return (reason: string) => x.abort(reason)
  }

  /**
   * preconnect opens keep-alive connections until `n` are idle for the target, so the first wave of
   * measured requests does not pay for TCP setup. Resolves when they are open (or failed), or on abort.
   */
  preconnect(url: URL, n: number, signal: AbortSignal): Promise<void> {
    const target = this.pool.origin(url.origin)
    const missing = n - this.pool.idleCount(target)
    if (missing <= 0 || this.closed) return Promise.resolve()
    const opening = Array.from({ length: missing }, () =>
      this.pool.connect(target, CONNECT_TIMEOUT_MS).then(
        (c) => c.release(),
        () => {},
      ),
    )
    return new Promise((resolve) => {
      signal.addEventListener('abort', () => resolve(), { once: true })
      void Promise.all(opening).then(() => resolve())
    })
  }

  /** close ends every running request ('client closed') and closes every connection. */
  close(): void {
    this.closed = true
    for (const x of [...this.running]) x.abort('client closed')
    this.pool.close()
  }
}

const encoder = new TextEncoder()

/** encodeRequest builds the bytes of a JSON POST; `body` may be pre-encoded and shared by requests. */
export function encodeRequest(
  url: URL,
  headers: Record<string, string>,
  body: string | Uint8Array,
): Uint8Array {
  const bytes = typeof body === 'string' ? encoder.encode(body) : body
  let head = `POST ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${url.host}\r\nconnection: keep-alive\r\n`
  head += `content-type: application/json\r\naccept: text/event-stream\r\ncontent-length: ${bytes.length}\r\n`
  for (const [k, v] of Object.entries(headers)) head += `${k}: ${v}\r\n`
  const headBytes = encoder.encode(`${head}\r\n`)
  const out = new Uint8Array(headBytes.length + bytes.length)
  out.set(headBytes, 0)
  out.set(bytes, headBytes.length)
  return out
}
