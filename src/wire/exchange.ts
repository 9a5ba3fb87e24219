import type { RequestTrace } from '../host/telemetry/spans.ts'
import type { AppError, ErrorShape } from '../http/errors.ts'
import type { BodyRange } from './body-range.ts'
import { LF } from './grammar.ts'
import { connectionTokens, SKIP_REQUEST, SKIP_RESPONSE } from './headers.ts'
import { type Conn, type ConnUser, codedError, type Target, writeAll } from './pool.ts'
import { nameAt, type RequestHead } from './request-parser.ts'
import {
  type ParserEvents,
  ProtocolError,
  type ResponseHead,
  ResponseParser,
  wholeReply,
} from './response-parser.ts'
import { errorResponse, latin1, statusLine } from './responses.ts'
import type { ForwardEnd, WireAction } from './route.ts'
import { unwatch, type Watched, watch } from './ticker.ts'
import {
  errorCode,
  upstreamConnectTimeout,
  upstreamDisconnected,
  upstreamTimeout,
  upstreamUnavailable,
} from './upstream-errors.ts'
import { finishReasons, readUsage, type TokenUsage, type UsageMode, UsageStream } from './usage.ts'

/**
 * WireExchange moves one request from a client connection of the wire front (src/wire) to an
 * HTTP/1.1 upstream and its response back, socket to socket: no Request, Response or stream objects,
 * no promise per chunk. It is the front's hot path, the way nginx's proxy module is nginx's, and the
 * only way modelgate moves a request to an engine.
 *
 * - The request goes out in one write: request line, the upstream's Host (never the client's: the
 *   framework behind the front sees one canonical Host), the front's own lines, the client's
 *   headers minus hop-by-hop ones, Content-Length, body.
 * - A reply with a Content-Length up to BUFFER_LIMIT (and not an event stream) is held until
 *   complete and written in one piece, so a failure half-way is still a clean 502. Anything else
 *   is written as it arrives: with its Content-Length, or re-framed chunked (close-delimited for
 *   an HTTP/1.0 client). Every upstream read becomes one client write (writes within one read are
 *   corked), so SSE chunks are never coalesced or delayed.
 * - Backpressure: when the client connection is full the upstream socket is paused until it drains.
 * - Deadlines: connect (pool.ts) and first byte (headers and complete body of a held reply, first
 *   body byte of a streamed one), checked by the shared ticker. Once bytes flow there is none.
 * - The client going away destroys the upstream connection at once: the engine sees the disconnect.
 * - A streamed event stream that breaks ends with an error event in the proxy shape and [DONE]; any
 *   other broken streamed body closes the client connection (the client sees a truncated body).
 * - `onEnd` runs exactly once with the outcome (ForwardEnd, src/wire/route.ts), with the engine's
 *   token counts when asked (`usage`, src/wire/usage.ts: read from the held reply, or from the
 *   stream's events as they pass; `strip` relays such a stream re-framed instead of verbatim, so
 *   that its usage chunk can be taken out), and, for a recording span, the finish reasons.
 * - `responseHead`: lines the front adds to the response head (a grant's rate-limit state).
 * - A traced request (WireForward.trace) gets its time to first token.
 */
export interface WireClient {
  /** The client spoke HTTP/1.0: no chunked framing. */
  readonly http10: boolean
  /**
   * The listener is stopping: this connection closes after the running response, so a response
   * whose head is still to be written says `Connection: close` (a client must not send another
   * request on it, which would race the close).
   */
  readonly draining: boolean
  /** write returns false when the connection is full; onClientDrain follows once it is not. */
  write(data: Uint8Array | string): boolean
  /**
   * exchangeDone: the response is complete at `now` (performance.now()); `reuse` tells whether the
   * connection may carry another.
   */
  exchangeDone(reuse: boolean, now: number): void
  /** closeConnection: the response cannot be completed; close after what was written. */
  closeConnection(): void
  /**
   * retried: the exchange ended without a word to the client (its upstream refused the connection,
   * WireForward.retry): carry out `action` for the same request instead.
   */
  retried?(action: WireAction): void
}

export interface WireForward {
  /** The client's request head: method, header fields (forwarded as received, hop-by-hop ones skipped). */
  head: RequestHead
  /** Path and query on the upstream. */
  target: string
  upstream: Target
  /**
   * extraHead: header lines (each ending CRLF) the front adds, '' for none: the client's peer address
   * when relaying to the framework (PEER_HEADER; a client's own copy is never forwarded).
   */
  extraHead: string
  /** drop: lower-case names of the client's fields not to forward beside SKIP_REQUEST (null: none). */
  drop?: readonly string[] | undefined
  body: BodyRange
  /** 0: no first-byte deadline. */
  firstByteTimeoutMs: number
  connectTimeoutMs: number
  /** Shape of the exchange's own errors (502/504). */
  errorShape: ErrorShape
  startedAt: number
  /** Header lines (each ending CRLF) added to the response head, '' or absent for none. */
  responseHead?: string | undefined
  /** Read the engine's usage (and strip the usage chunk of a stream): see WireForwardAction.usage. */
  usage?: UsageMode | undefined
  /** What a refused connection hands the request to instead of a 502 (WireForwardAction.retry). */
  retry?: { next(reason: unknown): WireAction } | undefined
  /**
   * trace: the request's server span (null: not traced). The exchange marks its first token (the
   * first body byte of a streamed answer) and, when the span records, reads the answer's finish
   * reasons with its usage; the front ends the span.
   */
  trace?: RequestTrace | null
  onEnd(info: ForwardEnd): void
}

const encoder = new TextEncoder()

/**
 * sseErrorEnding: the bytes that end a broken event stream: a blank line to close whatever event
 * was cut short (given the last two bytes sent), then the error event: in the proxy shape followed
 * by [DONE] (OpenAI's clients raise the `error` of a data line), or, on the Messages API, Anthropic's
 * `event: error` with its error body (its clients raise that event; its streams have no [DONE]).
 */
function sseErrorEnding(error: AppError, shape: ErrorShape, last: number, beforeLast: number): Uint8Array {
  const prefix = last === LF ? (beforeLast === LF ? '' : '\n') : '\n\n'
  if (shape === 'anthropic')
    return encoder.encode(`${prefix}event: error\ndata: ${JSON.stringify(error.toAnthropic())}\n\n`)
  return encoder.encode(`${prefix}data: ${JSON.stringify(error.toProxy())}\n\ndata: [DONE]\n\n`)
}

/** ok: a 2xx answer, the only kind whose body carries usage. */
const ok = (status: number) => status >= 200 && status < 300

/** BUFFER_LIMIT: replies up to this size with a Content-Length are held and written whole. */
const BUFFER_LIMIT = 8 * 1024 * 1024
const CHUNK_END = '\r\n'
const LAST_CHUNK = '0\r\n\r\n'

enum Phase {
  Head,
  FirstByte,
  Body,
  Done,
}

/** How the response body reaches the client. */
enum Mode {
  /** not decided yet, or no body */
  None,
  /** held until complete, then written with its Content-Length */
  Hold,
  /** written as it arrives, with the upstream's Content-Length */
  Length,
  /** written as it arrives, chunked */
  Chunked,
  /** written as it arrives, ended by closing the connection (HTTP/1.0 client) */
  Close,
}

/**
 * The upstream request is serialised into one reused slab and written from there: no buffer and
 * no string per header. Bun's sockets write synchronously, so the slab is free again as soon as
 * write returns; the rare unwritten rest is copied out. A stale-connection retry serialises again.
 */
let slab = Buffer.allocUnsafe(64 * 1024)

/**
 * requestInto writes the upstream request into the slab and returns its length: request line, the
 * upstream's Host, the front's extra lines, the client's field
 * lines as received minus those SKIP_REQUEST and its Connection header name, Content-Length, body.
 * Field lines are copied as runs of the received bytes (validated by the parser: no bare CR or LF).
 */
function requestInto(f: WireForward): number {
  const h = f.head
  const { fields, text, raw, rawStart } = h
  const bound =
    h.text.length + f.target.length + f.upstream.hostLine.length + f.extraHead.length + 64 + f.body.length
  if (bound > slab.length) slab = Buffer.allocUnsafe(Math.max(bound, 2 * slab.length))
  let pos = putLatin1(slab, 0, h.method)
  slab[pos++] = SPACE
  pos = putLatin1(slab, pos, f.target)
  pos = putLatin1(slab, pos, ' HTTP/1.1\r\n')
  pos = putLatin1(slab, pos, f.upstream.hostLine)
  if (f.extraHead !== '') pos = putLatin1(slab, pos, f.extraHead)
  let extra: readonly string[] | null = h.connection === '' ? null : connectionTokens(h.connection)
  if (f.drop) extra = extra ? [...extra, ...f.drop] : f.drop
  // run: text index where the current run of kept field lines starts (-1: none)
  let run = -1
  for (let k = 0; k < fields.length; k += 4) {
    const a = fields[k]!
    const keep = !skippedField(text, a, fields[k + 1]! - a, extra)
    if (keep) {
      if (run < 0) run = a
    } else if (run >= 0) {
      pos += raw.copy(slab, pos, rawStart + run, rawStart + a)
      run = -1
    }
  }
  // The last field line's CRLF follows the text.
  if (run >= 0) pos += raw.copy(slab, pos, rawStart + run, rawStart + h.text.length + 2)
  const m = h.method
  const n = f.body.length
  if (n > 0 || m === 'POST' || m === 'PUT' || m === 'PATCH') {
    pos = putLatin1(slab, pos, 'content-length: ')
    pos = writeDecimal(slab, pos, n)
    pos = putLatin1(slab, pos, '\r\n\r\n')
  } else pos = putLatin1(slab, pos, '\r\n')
  if (n > 0) f.body.copyTo(slab, pos)
  return pos + n
}

const SPACE = 32

/**
 * putLatin1 writes s at pos one byte per character, as Buffer.write(s, pos, 'latin1') does, and
 * returns the position after it. The strings here (method, target, Host line, framing) are short
 * and already validated as visible ASCII: a JS loop copies them for less than a native call costs.
 */
function putLatin1(buf: Uint8Array, pos: number, s: string): number {
  for (let i = 0; i < s.length; i++) buf[pos + i] = s.charCodeAt(i)
  return pos + s.length
}

/** skippedField: the field name at text[a, a+len) is not forwarded (SKIP_REQUEST, or named in Connection). */
function skippedField(text: string, a: number, len: number, extra: readonly string[] | null): boolean {
  const names = SKIP_BY_LENGTH[len]
  if (names) for (const name of names) if (nameAt(text, a, name)) return true
  if (extra) for (const name of extra) if (name.length === len && nameAt(text, a, name)) return true
  return false
}

/** SKIP_REQUEST by name length: a field is checked against the few names as long as its own. */
const SKIP_BY_LENGTH: (string[] | undefined)[] = []
for (const name of SKIP_REQUEST) {
  const same = SKIP_BY_LENGTH[name.length]
  if (same) same.push(name)
  else SKIP_BY_LENGTH[name.length] = [name]
}

/** writeDecimal writes a non-negative integer in ASCII digits at pos; returns the position after it. */
function writeDecimal(buf: Uint8Array, pos: number, value: number): number {
  let digits = 1
  for (let v = value; v >= 10; v = Math.floor(v / 10)) digits++
  let v = value
  for (let i = pos + digits - 1; i >= pos; i--) {
    buf[i] = 48 + (v % 10)
    v = Math.floor(v / 10)
  }
  return pos + digits
}

export class WireExchange implements ConnUser, ParserEvents, Watched {
  private conn: Conn | null = null
  private parserOrNull: ResponseParser | null = null
  private unwritten: Uint8Array | null = null
  private phase = Phase.Head
  private mode = Mode.None
  private received = 0
  private retried = false
  private status = 0
  private bytes = 0
  private ttftMs: number | null = null
  private sse = false
  private headText = ''
  private held: Buffer[] | null = null
  /** The chunked body is relayed with the upstream's framing (see onData). */
  private verbatim = false
  /** A verbatim read, written once the parser has accepted it (up to the response's end, if in it). */
  private verbatimRead: Buffer | null = null
  private last = LF
  private beforeLast = LF
  private paused = false
  private clientGone = false
  private expired: AppError | null = null
  private keepAlive: boolean
  /** Set once finished: whether to hand the connection back for reuse (after the cork is flushed). */
  private doneReuse: boolean | null = null
  /** performance.now() when finished (the client connection's last activity). */
  private endedAt = 0
  /** While an upstream read is handled, writes are corked: gathered and flushed as one client write. */
  private corked = false
  /** Usage read from a held reply, or the reader of a stream's events (null: not asked, or not a stream). */
  private usage: TokenUsage | null = null
  private meter: UsageStream | null = null
  /**
   * The corked writes of the current read; null when none. Not kept between reads: most reads of a
   * stream write nothing corked, and an empty array kept would cost them two memory loads each.
   */
  private cork: (Uint8Array | string)[] | null = null
  /** The finish reasons of a held reply, read for a recording span (a stream's are the meter's). */
  private reasons: string[] | null = null

  constructor(
    private readonly client: WireClient,
    private readonly f: WireForward,
  ) {
    this.keepAlive = f.head.keepAlive
  }

  start(): void {
    // The request was complete a moment ago: its clock reading is recent enough for the pool.
    const conn = this.f.upstream.pool.takeIdle(this.f.upstream, this.f.startedAt)
    if (conn) this.attach(conn)
    else this.open()
    // After the request is on its way: the engine works on it meanwhile.
    if (this.f.firstByteTimeoutMs > 0) watch(this)
  }

  private open(): void {
    this.f.upstream.pool.connect(this.f.upstream, this.f.connectTimeoutMs).then(
      (conn) => {
        if (this.phase === Phase.Done) return conn.destroy()
        this.attach(conn)
      },
      (err) => {
        if (this.phase !== Phase.Done) this.failBeforeHead(err)
      },
    )
  }

  private attach(conn: Conn): void {
    this.conn = conn
    conn.user = this
    this.received = 0
    this.parserOrNull = null
    const n = requestInto(this.f)
    const written = this.conn.socket!.write(slab, 0, n)
    this.unwritten = written >= n ? null : Buffer.from(slab.subarray(Math.max(written, 0), n))
  }

  /** The response parser, created on the first read that relayWhole does not take (most never need one). */
  private get parser(): ResponseParser {
    this.parserOrNull ??= new ResponseParser(this, this.f.head.method === 'HEAD')
    return this.parserOrNull
  }

  // ConnUser: the upstream socket.
  onDrain(): void {
    if (this.unwritten) this.unwritten = writeAll(this.conn!.socket!, this.unwritten)
  }

  onData(data: Buffer): void {
    if (
      this.received === 0 &&
      this.headKeepsAlive() &&
      this.f.head.method !== 'HEAD' &&
      this.relayWhole(data)
    )
      return
    this.received += data.length
    // A chunked body read from a chunk boundary on goes out with the engine's own chunk framing:
    // the bytes are written as received, once the parser has accepted them, and only up to the end
    // of the response (end() writes that part): what an engine sends after its last chunk, or a
    // malformed chunk or trailer, never reaches the client.
    if (this.mode === Mode.Chunked && !this.meter?.strip && (this.verbatim || this.parser.atChunkStart)) {
      this.verbatim = true
      this.verbatimRead = data
    }
    this.corked = true
    try {
      this.parser.feed(data)
    } catch (err) {
      this.verbatimRead = null
      this.conn?.destroy()
      this.fail(err)
    }
    if (this.verbatimRead !== null) {
      this.write(this.verbatimRead)
      this.verbatimRead = null
    }
    this.flush()
  }

  /** relayWhole: a complete plain reply in one read goes to the client as received (see wholeReply). */
  private relayWhole(data: Buffer): boolean {
    const reply = wholeReply(data)
    if (!reply) return false
    this.received = data.length
    this.status = reply.status
    this.bytes = reply.bodyBytes
    // The reply goes out first; the bookkeeping after it is off the client's wait.
    const extra = this.f.responseHead
    this.client.write(extra ? withHeadLines(data, extra) : data)
    if (this.f.usage) this.readHeld(data, data.length - reply.bodyBytes, data.length, reply.status)
    const now = performance.now()
    const conn = this.conn!
    conn.served = true
    if (this.unwritten) conn.destroy()
    else conn.release(now)
    this.finish(null, false, now)
    return true
  }

  onClose(conn: Conn): void {
    if (conn !== this.conn || this.phase === Phase.Done) return
    if (this.parserOrNull?.closed()) return
    // A reused connection the upstream had closed meanwhile: nothing was processed, send again.
    if (conn.served && this.received === 0 && !this.retried) {
      this.retried = true
      this.conn = null
      this.open()
      return
    }
    this.fail(codedError('ConnectionClosed', 'the upstream closed the connection'))
  }

  // The client connection.
  onClientDrain(): void {
    if (!this.paused) return
    this.paused = false
    if (this.phase !== Phase.Done) this.conn?.socket?.resume()
  }

  onClientClose(): void {
    if (this.phase === Phase.Done) return
    this.clientGone = true
    this.conn?.destroy()
    this.finish(null)
  }

  /** tick: the first-byte deadline (see ticker.ts). */
  tick(now: number): void {
    if (this.phase === Phase.Body || this.phase === Phase.Done) {
      unwatch(this)
      return
    }
    if (now - this.f.startedAt < this.f.firstByteTimeoutMs) return
    this.expired = upstreamTimeout(this.f.firstByteTimeoutMs)
    this.conn?.destroy()
    this.corked = true
    this.fail(new Error('first_byte'))
    this.flush()
  }

  // ParserEvents: the upstream response.
  head(h: ResponseHead): void {
    this.status = h.status
    this.sse = h.contentType?.startsWith('text/event-stream') === true
    let text = statusLine(h.status)
    const extra = h.connection ? connectionTokens(h.connection) : null
    for (const pair of h.headers) {
      const name = pair[0]
      if (SKIP_RESPONSE.has(name) || (extra !== null && extra.length > 0 && extra.includes(name))) continue
      text += `${name}: ${pair[1]}\r\n`
    }
    if (h.framing === 'none') {
      // HEAD keeps the length the upstream announced; 204 and 304 have none.
      if (h.length >= 0 && this.f.head.method === 'HEAD') text += `content-length: ${h.length}\r\n`
      else if (h.status !== 204 && h.status !== 304) text += 'content-length: 0\r\n'
    } else if (h.framing === 'length' && !this.sse && h.length <= BUFFER_LIMIT) {
      this.mode = Mode.Hold
    } else if (h.framing === 'length') {
      this.mode = Mode.Length
      text += `content-length: ${h.length}\r\n`
    } else if (this.client.http10) {
      this.mode = Mode.Close
      this.keepAlive = false
    } else {
      this.mode = Mode.Chunked
      text += 'transfer-encoding: chunked\r\n'
    }
    if (!this.headKeepsAlive()) text += 'connection: close\r\n'
    if (this.f.responseHead) text += this.f.responseHead
    if (this.f.usage && this.sse && (this.mode === Mode.Chunked || this.mode === Mode.Close))
      this.meter = new UsageStream(this.f.usage === 'strip', this.f.trace?.recording === true)
    if (this.mode === Mode.Hold) {
      this.headText = text
      this.phase = Phase.FirstByte
      return
    }
    this.write(latin1(`${text}\r\n`))
    this.phase = Phase.FirstByte
  }

  body(buf: Buffer, start: number, end: number): void {
    const n = end - start
    if (n === 0) return
    if (this.mode === Mode.Hold) {
      const piece = buf.subarray(start, end)
      if (this.held) this.held.push(piece)
      else this.held = [piece]
      return
    }
    if (this.phase === Phase.FirstByte) {
      this.phase = Phase.Body
      this.ttftMs = performance.now() - this.f.startedAt
      this.f.trace?.firstToken()
    }
    const meter = this.meter
    if (meter !== null) {
      const out = meter.feed(buf, start, end)
      if (out !== null) {
        if (out.byteLength > 0) this.writePiece(out, 0, out.byteLength)
        return
      }
    }
    this.writePiece(buf, start, end)
  }

  /** writePiece: body bytes buf[start, end) to the client, framed as the mode says (none: verbatim, already out). */
  private writePiece(buf: Uint8Array, start: number, end: number): void {
    const n = end - start
    this.bytes += n
    this.beforeLast = n > 1 ? buf[end - 2]! : this.last
    this.last = buf[end - 1]!
    // Relayed verbatim, the bytes already went out with the read: the parser only follows them.
    if (this.verbatim) return
    const piece = buf.subarray(start, end)
    if (this.mode === Mode.Chunked) {
      this.write(`${n.toString(16)}\r\n`)
      this.write(piece)
      this.write(CHUNK_END)
    } else this.write(piece)
  }

  end(): void {
    const conn = this.conn!
    conn.served = true
    // A socket paused for a slow client is never pooled: nothing would resume it for the next request.
    if (this.parser.closeDelimited || this.paused || this.parser.trailingBytes || this.unwritten)
      conn.destroy()
    else conn.release()
    if (this.mode === Mode.Hold) {
      const held = this.held ?? []
      const body = held.length === 1 ? held[0]! : Buffer.concat(held)
      this.held = null
      this.bytes = body.byteLength
      this.write(latin1(`${this.headText}content-length: ${body.byteLength}\r\n\r\n`))
      this.write(body)
      if (this.f.usage) this.readHeld(body, 0, body.byteLength, this.status)
    } else if (this.meter !== null && !this.verbatim) {
      const rest = this.meter.rest()
      if (rest !== null && rest.byteLength > 0) this.writePiece(rest, 0, rest.byteLength)
      if (this.mode === Mode.Chunked) this.write(LAST_CHUNK)
    } else if (this.mode === Mode.Chunked && !this.verbatim) this.write(LAST_CHUNK)
    else if (this.verbatimRead !== null) {
      this.write(this.verbatimRead.subarray(0, this.parser.endInInput))
      this.verbatimRead = null
    }
    this.finish(null)
  }

  /** readHeld: the engine's counts of a held reply buf[a, b), and its finish reasons for a recording span. */
  private readHeld(buf: Buffer, a: number, b: number, status: number): void {
    this.usage = readUsage(buf, a, b)
    if (this.f.trace?.recording && ok(status)) this.reasons = finishReasons(buf, a, b)
  }

  /** write goes to the cork while an upstream read is handled, else straight to the client. */
  private write(data: Uint8Array | string): void {
    if (!this.corked) {
      if (!this.client.write(data)) this.pause()
    } else if (this.cork) this.cork.push(data)
    else this.cork = [data]
  }

  private flush(): void {
    this.corked = false
    const cork = this.cork
    if (cork !== null) {
      this.cork = null
      let full: boolean
      if (cork.length === 1) full = !this.client.write(cork[0]!)
      else {
        const parts = cork.map((p) => (typeof p === 'string' ? Buffer.from(p, 'latin1') : p))
        full = !this.client.write(Buffer.concat(parts))
      }
      if (full) this.pause()
    }
    if (this.phase === Phase.Done && this.doneReuse !== null) this.handBack()
  }

  private pause(): void {
    if (this.paused || this.phase === Phase.Done) return
    this.paused = true
    this.conn?.socket?.pause()
  }

  /** fail: the upstream failed (closed, unparsable, deadline) before the response ended. */
  private fail(cause: unknown): void {
    if (this.phase === Phase.Done) return
    if (this.mode === Mode.None || this.mode === Mode.Hold) {
      // Nothing of the response was written yet (a bodiless response ends with its head).
      this.failBeforeHead(cause)
      return
    }
    this.conn?.destroy()
    const error = this.expired ?? upstreamDisconnected(cause)
    this.status = error.status
    // Relayed verbatim and cut inside a chunk: no clean place for an error event.
    const cut = this.verbatim && (!this.parser.atChunkStart || cause instanceof ProtocolError)
    if (this.sse && this.mode === Mode.Chunked && !cut) {
      const ending = sseErrorEnding(error, this.f.errorShape, this.last, this.beforeLast)
      this.write(`${ending.byteLength.toString(16)}\r\n`)
      this.write(ending)
      this.write(`${CHUNK_END}${LAST_CHUNK}`)
      this.finish(error)
      return
    }
    if (this.sse && this.mode === Mode.Close)
      this.write(sseErrorEnding(error, this.f.errorShape, this.last, this.beforeLast))
    this.keepAlive = false
    this.finish(error, true)
  }

  /** failBeforeHead answers the client with the proxy error: nothing of the response was written. */
  private failBeforeHead(cause: unknown): void {
    this.conn?.destroy()
    if (this.clientGone) return
    const retry = this.f.retry
    // Refused before a connection existed: nothing was sent, so another backend may take it (an
    // engine that stopped between the plan and the connect, as a move's source does).
    if (
      retry !== undefined &&
      this.conn === null &&
      this.expired === null &&
      errorCode(cause) !== 'ConnectTimeout' &&
      this.client.retried !== undefined
    ) {
      this.phase = Phase.Done
      if (this.f.firstByteTimeoutMs > 0) unwatch(this)
      this.client.retried(retry.next(upstreamUnavailable(cause)))
      return
    }
    const error =
      this.expired ??
      (errorCode(cause) === 'ConnectTimeout'
        ? upstreamConnectTimeout(this.f.connectTimeoutMs)
        : upstreamUnavailable(cause))
    this.status = error.statusIn(this.f.errorShape)
    this.write(errorResponse(error, this.f.errorShape, this.headKeepsAlive(), this.f.responseHead))
    this.finish(error)
  }

  /**
   * headKeepsAlive: whether the response head about to be written keeps the client connection open
   * (decided then, not at the start: the listener may have begun stopping meanwhile).
   */
  private headKeepsAlive(): boolean {
    if (this.client.draining) this.keepAlive = false
    return this.keepAlive
  }

  private finish(error: AppError | null, close = false, now = performance.now()): void {
    this.phase = Phase.Done
    this.endedAt = now
    if (this.f.firstByteTimeoutMs > 0) unwatch(this)
    const info: ForwardEnd = {
      status: this.clientGone ? 499 : this.status,
      bytes: this.bytes,
      durationMs: now - this.f.startedAt,
      ttftMs: this.ttftMs,
      streamed: this.mode === Mode.Length || this.mode === Mode.Chunked || this.mode === Mode.Close,
      aborted: this.clientGone,
    }
    if (error && !this.clientGone) info.error = error.code
    const usage = this.usage ?? this.meter?.usage ?? null
    if (usage !== null) info.usage = usage
    else if (this.meter !== null && this.meter.chunks > 0) info.chunks = this.meter.chunks
    const reasons = this.reasons ?? this.meter?.reasons ?? null
    if (reasons !== null && reasons.length > 0) info.finishReasons = reasons
    try {
      this.f.onEnd(info)
    } catch (err) {
      console.error('proxy onEnd handler failed:', err)
    }
    if (this.clientGone) return
    this.doneReuse = !close && this.keepAlive && this.mode !== Mode.Close
    // Within an upstream read the corked bytes go out first; flush() hands the connection back.
    if (!this.corked) this.handBack()
  }

  private handBack(): void {
    const reuse = this.doneReuse
    this.doneReuse = null
    if (reuse) this.client.exchangeDone(true, this.endedAt)
    else this.client.closeConnection()
  }
}

/** withHeadLines: a complete response as received with `lines` added after its status line (which ends CRLF). */
function withHeadLines(data: Buffer, lines: string): Buffer {
  const eol = data.indexOf(LF) + 1
  const out = Buffer.allocUnsafe(data.length + lines.length)
  data.copy(out, 0, 0, eol)
  putLatin1(out, eol, lines)
  data.copy(out, eol + lines.length, eol)
  return out
}
