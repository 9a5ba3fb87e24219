import type { Socket } from 'bun'
import { errorMessage } from './sse-scan.ts'

/*
 * The connection layer of HttpStreamClient: one keep-alive HTTP/1.1 socket and the response being
 * read on it (status line, headers, then a chunked, content-length or close-delimited body handed on
 * as latin1 text with its arrival time). Socket events reach connections through the Inbox.
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

type BodyMode = 'chunked' | 'length' | 'close'

/** parseHex reads a chunk-size line (hex digits, optional `;extensions`); -1 when malformed. */
function parseHex(s: string, from: number, to: number): number {
  let n = 0
  let digits = 0
  for (let i = from; i < to; i++) {
    const c = s.charCodeAt(i)
    let d: number
    if (c >= 48 && c <= 57) d = c - 48
    else if (c >= 97 && c <= 102) d = c - 87
    else if (c >= 65 && c <= 70) d = c - 55
    else if (c === 59 /* ; */ || c === 32 || c === 9) break
    else return -1
    n = n * 16 + d
    digits++
  }
  return digits > 0 ? n : -1
}

/** Connection is one socket and the response currently being read on it. */
export class Connection {
  socket: Socket<Connection> | null = null
  pending: Pending | null = null
  closed = false
  idleSince = 0
  private head = ''
  private headerDone = false
  private status = 0
  private mode: BodyMode = 'close'
  private remaining = 0
  private chunkState: 'size' | 'data' | 'crlf' | 'trailer' = 'size'
  private buf = ''
  private keepAlive = true
  private errorBody = ''
  private received = false
  private unsent: Uint8Array | null = null
  /** onGiveUp: a preconnect waiter to settle if the socket closes before it opened. */
  onGiveUp: (() => void) | null = null

  constructor(
    readonly key: string,
    private readonly release: (c: Connection) => void,
  ) {}

  send(p: Pending): void {
    this.pending = p
    this.head = ''
    this.headerDone = false
    this.status = 0
    this.buf = ''
    this.errorBody = ''
    this.received = false
    this.chunkState = 'size'
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

  onData(data: string, at: number): void {
    const p = this.pending
    if (!p) {
      // bytes on an idle connection: the server is not speaking HTTP/1.1 as expected
      this.destroy()
      return
    }
    this.received = true
    let text = data
    if (!this.headerDone) {
      this.head += text
      const endOfHead = this.head.indexOf('\r\n\r\n')
      if (endOfHead < 0) return
      text = this.head.slice(endOfHead + 4)
      this.parseHead(this.head.slice(0, endOfHead))
      this.headerDone = true
      if (this.status === 101 || (this.status >= 100 && this.status < 200)) {
        // interim response: start over with what follows it
        this.headerDone = false
        this.head = ''
        if (text) this.onData(text, at)
        return
      }
      if (this.mode === 'length' && this.remaining === 0) {
        this.complete(at)
        return
      }
    }
    this.consume(text, at)
  }

  private parseHead(head: string): void {
    const lines = head.split('\r\n')
    const statusLine = lines[0] ?? ''
    this.status = Number(statusLine.split(' ')[1]) || 0
    this.keepAlive = !statusLine.startsWith('HTTP/1.0')
    this.mode = 'close'
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i]!
      const colon = line.indexOf(':')
      if (colon < 0) continue
      const name = line.slice(0, colon).trim().toLowerCase()
      const value = line
        .slice(colon + 1)
        .trim()
        .toLowerCase()
      if (name === 'transfer-encoding' && value.includes('chunked')) this.mode = 'chunked'
      else if (name === 'content-length' && this.mode !== 'chunked') {
        this.mode = 'length'
        this.remaining = Number(value) || 0
      } else if (name === 'connection') {
        if (value.includes('close')) this.keepAlive = false
        else if (value.includes('keep-alive')) this.keepAlive = true
      }
    }
    if (this.mode === 'close') this.keepAlive = false
  }

  private deliver(text: string, at: number): void {
    if (text === '') return
    if (this.status >= 200 && this.status < 300) this.pending?.cb.body(text, at)
    else if (this.errorBody.length < 4096) this.errorBody += text
  }

  private consume(text: string, at: number): void {
    if (this.mode === 'close') {
      this.deliver(text, at)
      return
    }
    if (this.mode === 'length') {
      const take = text.length <= this.remaining ? text : text.slice(0, this.remaining)
      this.remaining -= take.length
      this.deliver(take, at)
      if (this.remaining === 0) this.complete(at)
      return
    }
    // chunked: walk with an offset and slice out payloads only (this runs once per token)
    const buf = this.buf === '' ? text : this.buf + text
    let pos = 0
    const len = buf.length
    for (;;) {
      if (this.chunkState === 'size') {
        const nl = buf.indexOf('\r\n', pos)
        if (nl < 0) break
        const size = parseHex(buf, pos, nl)
        pos = nl + 2
        if (size < 0) {
          this.fail('malformed chunked encoding', at)
          return
        }
        if (size === 0) this.chunkState = 'trailer'
        else {
          this.remaining = size
          this.chunkState = 'data'
        }
      } else if (this.chunkState === 'data') {
        if (pos >= len) break
        const end = Math.min(len, pos + this.remaining)
        this.remaining -= end - pos
        this.deliver(pos === 0 && end === len ? buf : buf.slice(pos, end), at)
        pos = end
        if (this.remaining === 0) this.chunkState = 'crlf'
      } else if (this.chunkState === 'crlf') {
        if (len - pos < 2) break
        pos += 2
        this.chunkState = 'size'
      } else {
        const nl = buf.indexOf('\r\n', pos)
        if (nl < 0) break
        const empty = nl === pos
        pos = nl + 2
        if (empty) {
          this.buf = ''
          this.complete(at)
          return
        }
      }
    }
    this.buf = pos >= len ? '' : buf.slice(pos)
  }

  private complete(at: number): void {
    const p = this.pending
    this.pending = null
    if (!p) return
    const ok = this.status >= 200 && this.status < 300
    p.cb.end(this.status, ok ? null : errorMessage(this.errorBody || `HTTP ${this.status}`), at)
    if (this.keepAlive && !this.closed) {
      this.idleSince = performance.now()
      this.release(this)
    } else this.destroy()
  }

  private fail(message: string, at: number): void {
    const p = this.pending
    this.pending = null
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
    if (this.headerDone && this.mode === 'close') {
      const ok = this.status >= 200 && this.status < 300
      p.cb.end(this.status, ok ? null : errorMessage(this.errorBody || `HTTP ${this.status}`), at)
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
