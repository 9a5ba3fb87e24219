import type { Socket } from 'bun'
import { type ParserEvents, type ResponseHead, ResponseParser } from '../../src/wire/response-parser.ts'
import { errorMessage } from './sse-scan.ts'

/*
 * The connection layer of HttpStreamClient: one keep-alive HTTP/1.1 socket and the response being
 * read on it, framed by the proxy's own ResponseParser (interim 1xx skipped; chunked, content-length
 * or close-delimited bodies), the body handed on as latin1 text with its arrival time. Socket
 * events reach connections through the Inbox.
 */

/** StreamCallbacks receive one response: body text as it arrives, then `end` exactly once. */
export interface StreamCallbacks {
  /** body receives latin1 text of the (de-chunked) response body of a 2xx response. */
  body(text: string, at: number): void
  /** end: the response is complete (`status` 0 when nothing was received). */
  end(status: number, errorText: string | null, at: number): void
}

export interface Pending {
  payload: Uint8Array
  cb: StreamCallbacks
  reused: boolean
  retry: () => void
}

/** An error body is kept up to this many characters for its message. */
const ERROR_BODY_MAX = 4096

/** Connection is one socket and the response currently being read on it. */
export class Connection implements ParserEvents {
  socket: Socket<Connection> | null = null
  pending: Pending | null = null
  closed = false
  idleSince = 0
  /** The current response's parser (a fresh one per request). */
  private parser: ResponseParser | null = null
  private status = 0
  private keepAlive = true
  private errorBody = ''
  private received = false
  /** The arrival time of the bytes being parsed, for the body events they produce. */
  private at = 0
  private unsent: Uint8Array | null = null
  /** onGiveUp: a preconnect waiter to settle if the socket closes before it opened. */
  onGiveUp: (() => void) | null = null

  constructor(
    readonly key: string,
    private readonly release: (c: Connection) => void,
  ) {}

  send(p: Pending): void {
    this.pending = p
    this.parser = new ResponseParser(this, false)
    this.status = 0
    this.errorBody = ''
    this.received = false
    this.write(p.payload)
  }

  private write(bytes: Uint8Array): void {
    const s = this.socket
    if (!s) return
    const n = s.write(bytes)
    this.unsent = n < bytes.length ? bytes.subarray(Math.max(0, n)) : null
  }

  drain(): void {
    if (this.unsent) this.write(this.unsent)
  }

  onData(data: Buffer, at: number): void {
    const parser = this.parser
    if (!this.pending || !parser) {
      // bytes on an idle connection: the server is not speaking HTTP/1.1 as expected
      this.destroy()
      return
    }
    this.received = true
    this.at = at
    try {
      parser.feed(data)
    } catch (err) {
      this.fail(err instanceof Error ? err.message : String(err), at)
      return
    }
    // Bytes after the end of the response: the connection cannot carry another one.
    if (parser.done) this.complete(at, !parser.trailingBytes)
  }

  // ParserEvents: the response on this connection.
  head(h: ResponseHead): void {
    this.status = h.status
    this.keepAlive = h.keepAlive
  }

  body(buf: Buffer, start: number, end: number): void {
    if (this.ok) this.pending?.cb.body(buf.toString('latin1', start, end), this.at)
    else if (this.errorBody.length < ERROR_BODY_MAX) this.errorBody += buf.toString('latin1', start, end)
  }

  /** end: the parser saw the response end; it is completed once the read is parsed (see onData). */
  end(): void {}

  private complete(at: number, reusable: boolean): void {
    const p = this.pending
    this.pending = null
    this.parser = null
    if (!p) return
    p.cb.end(this.status, this.errorText(), at)
    if (reusable && this.keepAlive && !this.closed) {
      this.idleSince = performance.now()
      this.release(this)
    } else this.destroy()
  }

  private get ok(): boolean {
    return this.status >= 200 && this.status < 300
  }

  /** errorText: null for a 2xx response, else the engine's message from the error body. */
  private errorText(): string | null {
    return this.ok ? null : errorMessage(this.errorBody || `HTTP ${this.status}`)
  }

  private fail(message: string, at: number): void {
    const p = this.pending
    this.pending = null
    this.parser = null
    p?.cb.end(this.status, message, at)
    this.destroy()
  }

  onClose(err?: Error): void {
    if (this.closed) return
    this.closed = true
    this.onGiveUp?.()
    this.onGiveUp = null
    const p = this.pending
    this.pending = null
    if (!p) return
    const at = performance.now()
    if (!this.received && p.reused) {
      // stale keep-alive socket: retry on a fresh one
      p.retry()
      return
    }
    // A close-delimited body ends with the close.
    if (this.parser?.closed()) {
      this.parser = null
      p.cb.end(this.status, this.errorText(), at)
      return
    }
    p.cb.end(
      this.status,
      err?.message ?? (this.received ? 'connection closed mid-response' : 'connection closed'),
      at,
    )
  }

  destroy(): void {
    if (!this.closed) {
      this.closed = true
      this.socket?.terminate()
    }
  }

  /** abort ends the current response at once (the socket is closed, never reused). */
  abort(message: string): void {
    const p = this.pending
    this.pending = null
    this.destroy()
    p?.cb.end(0, message, performance.now())
  }
}
