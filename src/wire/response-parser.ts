import { bareLf, CR, DIGITS, FIELD_LINES, hexValue, isOws, LF, TCHAR } from './grammar.ts'
import { HOP_BY_HOP } from './headers.ts'

/**
 * ResponseParser reads HTTP/1.x responses from a byte stream, incrementally: it is fed whatever the
 * socket delivers and reports the head, each body piece (as a view of the bytes received, no copy)
 * and the end. Body framing follows RFC 9112 §6.3: no body (HEAD, 1xx, 204, 304), chunked,
 * Content-Length, or until the connection closes. Interim 1xx responses are skipped.
 */
export type Framing = 'none' | 'length' | 'chunked' | 'close'

export interface ResponseHead {
  status: number
  /** Header pairs as received (names lower-cased). */
  headers: [string, string][]
  framing: Framing
  /** Content-Length, or -1 when absent. */
  length: number
  /** The connection may carry another request after this response. */
  keepAlive: boolean
  /** The Connection header (lower-cased), '' when absent. */
  connection: string
  contentType: string | null
}

export interface ParserEvents {
  head(head: ResponseHead): void
  /** body: the bytes buf[start, end) are the next piece of the body (a range, so no view per piece). */
  body(buf: Buffer, start: number, end: number): void
  end(): void
}

export class ProtocolError extends Error {
  readonly code = 'UpstreamProtocolError'
}

enum State {
  Head,
  Length,
  ChunkSize,
  ChunkData,
  ChunkDataEnd,
  Trailers,
  Close,
  Done,
}

const MAX_HEAD = 64 * 1024
const MAX_LINE = 8 * 1024
/** Needles as bytes: a string needle is encoded again on every search. */
const HEAD_END = Buffer.from('\r\n\r\n', 'latin1')
const CRLF = Buffer.from('\r\n', 'latin1')
/**
 * The status line, checked in place at the start of the head: HTTP/1.x, SP, a three-digit status,
 * then SP and a reason phrase without controls but HTAB, or nothing (RFC 9112 §4).
 */
const STATUS_LINE = /HTTP\/1\.\d [1-9]\d\d(?: [^\x00-\x08\x0a-\x1f\x7f]*)?(?=\r\n|$)/y

export class ResponseParser {
  private state = State.Head
  private pending: Buffer | null = null
  private remaining = 0
  /** A chunk's data is followed by CRLF: how many of those bytes are still to skip. */
  private crlfLeft = 0
  /** trailingBytes: bytes arrived after the end of the response (the connection must be closed). */
  trailingBytes = false
  /**
   * endInInput: when a feed ended the response, how many bytes of that feed's input belonged to it
   * (what follows is not this response's, and must never reach the client); -1 before.
   */
  endInInput = -1

  constructor(
    private readonly events: ParserEvents,
    /** headOnly: the request was HEAD, so the response has no body whatever its headers say. */
    private readonly headOnly: boolean,
  ) {}

  get done(): boolean {
    return this.state === State.Done
  }

  /** atChunkStart: a chunked body is between chunks (what was fed so far ends a chunk exactly). */
  get atChunkStart(): boolean {
    return this.state === State.ChunkSize && this.pending === null
  }

  /** closeDelimited: the body runs until the connection closes (the close is its end). */
  get closeDelimited(): boolean {
    return this.state === State.Close
  }

  /** feed parses the next bytes; it throws ProtocolError on a malformed response. */
  feed(input: Buffer): void {
    let buf = input
    if (this.pending) {
      buf = Buffer.concat([this.pending, input])
      this.pending = null
    }
    let off = 0
    const n = buf.length
    // Bytes of an earlier read held in `pending` come first in buf.
    const base = n - input.length
    while (off < n) {
      switch (this.state) {
        case State.Head: {
          const end = buf.indexOf(HEAD_END, off)
          if (end < 0) {
            if (n - off > MAX_HEAD) throw new ProtocolError('response head too large')
            // A head whose lines end in a bare LF never shows CRLFCRLF: refuse it now, not at a
            // deadline (there may be none). Only the bytes of this read are new to the scan.
            if (bareLf(buf, off, Math.max(off, base), n)) throw new ProtocolError('bare LF in response head')
            this.pending = Buffer.from(buf.subarray(off))
            return
          }
          const head = this.parseHead(buf.toString('latin1', off, end))
          off = end + 4
          if (head) this.startBody(head)
          break
        }
        case State.Length:
        case State.ChunkData: {
          const take = Math.min(this.remaining, n - off)
          this.events.body(buf, off, off + take)
          off += take
          this.remaining -= take
          if (this.remaining === 0) {
            if (this.state === State.Length) this.finishAt(off - base)
            else {
              this.state = State.ChunkDataEnd
              this.crlfLeft = 2
            }
          }
          break
        }
        case State.ChunkDataEnd: {
          const c = buf[off]!
          if (c !== (this.crlfLeft === 2 ? CR : LF))
            throw new ProtocolError('chunk data not followed by CRLF')
          off++
          if (--this.crlfLeft === 0) this.state = State.ChunkSize
          break
        }
        case State.ChunkSize: {
          // Hex digits, optional `;extensions`, CRLF — parsed from the bytes, no strings. The line is
          // a few bytes: a loop finds its end sooner than a native indexOf call per chunk.
          const limit = Math.min(n, off + MAX_LINE + 1)
          let eol = off
          while (eol < limit && buf[eol] !== LF) eol++
          if (eol === limit) {
            if (limit - off > MAX_LINE) throw new ProtocolError('chunk size line too long')
            this.pending = Buffer.from(buf.subarray(off))
            return
          }
          let size = 0
          let digits = 0
          let i = off
          for (; i < eol; i++) {
            const d = hexValue(buf[i]!)
            if (d < 0) break
            size = size * 16 + d
            if (++digits > 12) throw new ProtocolError('chunk size too large')
          }
          const stop = buf[i]!
          if (
            digits === 0 ||
            (stop !== CR && stop !== 59 && stop !== 32 && stop !== 9) ||
            buf[eol - 1] !== CR
          )
            throw new ProtocolError('bad chunk size line')
          off = eol + 1
          if (size === 0) this.state = State.Trailers
          else {
            this.state = State.ChunkData
            this.remaining = size
          }
          break
        }
        case State.Trailers: {
          const eol = buf.indexOf(CRLF, off)
          if (eol < 0) {
            if (n - off > MAX_HEAD) throw new ProtocolError('trailers too large')
            this.pending = Buffer.from(buf.subarray(off))
            return
          }
          const empty = eol === off
          if (!empty) {
            // Trailer fields follow the field syntax too (rare: one string per trailer line).
            FIELD_LINES.lastIndex = 0
            if (!FIELD_LINES.test(`\r\n${buf.toString('latin1', off, eol)}`))
              throw new ProtocolError('malformed trailer field')
          }
          off = eol + 2
          if (empty) this.finishAt(off - base)
          break
        }
        case State.Close:
          this.events.body(buf, off, n)
          off = n
          break
        case State.Done:
          // Bytes after the end of a response we did not ask for: the connection is not reusable.
          this.trailingBytes = true
          return
      }
    }
  }

  /** finishAt: the response ended after `end` bytes of the current input. */
  private finishAt(end: number): void {
    this.endInInput = end
    this.finish()
  }

  /** closed: the connection ended; true when that completes a close-delimited body. */
  closed(): boolean {
    if (this.state !== State.Close) return false
    this.finish()
    return true
  }

  private parseHead(text: string): ResponseHead | null {
    // The whole head is checked before anything of it is used (the head is relayed to the client):
    // a strict status line, then every field line in one test (FIELD_LINES: token names, no
    // whitespace before the colon, no obs-fold, no control byte but HTAB in a value).
    STATUS_LINE.lastIndex = 0
    if (!STATUS_LINE.test(text))
      throw new ProtocolError(text.startsWith('HTTP/1.') ? 'bad status line' : 'not an HTTP/1.x response')
    let eol = STATUS_LINE.lastIndex
    FIELD_LINES.lastIndex = eol
    if (!FIELD_LINES.test(text)) throw new ProtocolError('malformed header field')
    const status =
      (text.charCodeAt(9) - 48) * 100 + (text.charCodeAt(10) - 48) * 10 + (text.charCodeAt(11) - 48)
    const http10 = text.charCodeAt(7) === 48
    // Interim responses (100 Continue, 103 Early Hints) are followed by the real one.
    if (status < 200) {
      if (status === 101) throw new ProtocolError('protocol upgrade is not supported')
      return null
    }
    const headers: [string, string][] = []
    let length = -1
    let chunked = false
    let connection = ''
    let contentType: string | null = null
    const n = text.length
    for (let a = eol + 2; a < n; a = eol + 2) {
      // FIELD_LINES allowed a CR only as part of a CRLF, and put a ':' right after the name.
      eol = text.indexOf('\r', a)
      if (eol < 0) eol = n
      const colon = text.indexOf(':', a)
      const name = text.slice(a, colon).toLowerCase()
      let v = colon + 1
      let e = eol
      while (v < e && isOws(text.charCodeAt(v))) v++
      while (e > v && isOws(text.charCodeAt(e - 1))) e--
      const value = text.slice(v, e)
      if (name === 'content-length') {
        const cl = Number(value)
        if (!DIGITS.test(value) || !Number.isSafeInteger(cl) || (length >= 0 && cl !== length))
          throw new ProtocolError('bad content-length')
        length = cl
      } else if (name === 'transfer-encoding') {
        // Only `chunked` alone is decoded: another coding (or a list) would reach the client with
        // framing we did not check, and a near miss (`xchunked`) would leave it waiting forever.
        if (chunked || value.length !== 7 || value.toLowerCase() !== 'chunked')
          throw new ProtocolError('unsupported transfer-encoding')
        chunked = true
      } else if (name === 'connection') connection = value.toLowerCase()
      else if (name === 'content-type') contentType = value
      headers.push([name, value])
    }
    // Both framings, or chunked from an HTTP/1.0 server, is the classic smuggling set-up (RFC 9112
    // §6.1, §6.3): the framing is faulty, not something to pick one reading of.
    if (chunked && length >= 0) throw new ProtocolError('transfer-encoding with content-length')
    if (chunked && http10) throw new ProtocolError('transfer-encoding in an HTTP/1.0 response')
    let framing: Framing
    if (this.headOnly || status === 204 || status === 304) framing = 'none'
    else if (chunked) framing = 'chunked'
    else if (length >= 0) framing = length === 0 ? 'none' : 'length'
    else framing = 'close'
    const keepAlive =
      framing !== 'close' && (http10 ? connection.includes('keep-alive') : !connection.includes('close'))
    return { status, headers, framing, length, keepAlive, connection, contentType }
  }

  private startBody(head: ResponseHead): void {
    switch (head.framing) {
      case 'none':
        this.state = State.Done
        this.events.head(head)
        this.events.end()
        return
      case 'length':
        this.state = State.Length
        this.remaining = head.length
        break
      case 'chunked':
        this.state = State.ChunkSize
        break
      case 'close':
        this.state = State.Close
        break
    }
    this.events.head(head)
  }

  private finish(): void {
    this.state = State.Done
    this.events.end()
  }
}

/** Header names a verbatim relay must not carry: the hop-by-hop ones. */
const NOT_VERBATIM = HOP_BY_HOP.map((n) => Buffer.from(n))
const CONTENT_LENGTH = Buffer.from('content-length')
const CONTENT_TYPE = Buffer.from('content-type')
const EVENT_STREAM = Buffer.from('text/event-stream')
const HTTP11 = Buffer.from('HTTP/1.1 ')
const SP = 32
const HTAB = 9

/** nameIs: bytes [from, to) spell `name` (lower-case letters and '-'), ignoring case. */
function nameIs(data: Buffer, from: number, to: number, name: Buffer): boolean {
  if (to - from !== name.length) return false
  for (let i = 0; i < name.length; i++) if ((data[from + i]! | 0x20) !== name[i]) return false
  return true
}

/** notText: byte c is a control other than HTAB (0x00-0x1F, 0x7F), never allowed in a head's text. */
function notText(c: number): boolean {
  return (c < 32 && c !== HTAB) || c === 127
}

/**
 * wholeReply recognises the common engine reply that can be relayed byte for byte: one read holding
 * exactly a complete HTTP/1.1 response with a Content-Length body, not an event stream, and no
 * header a proxy must drop. It returns the status and body length, or null when the response needs
 * the full parser. One pass over the head bytes, no strings (this runs for every request).
 *
 * As the bytes go out unchanged, the head is held to the full parser's syntax: token field names
 * with the colon right after, no control byte but HTAB anywhere, CR only before LF. Anything else
 * is left to the full parser, which refuses it (ProtocolError): nothing of such a reply is relayed.
 */
export function wholeReply(data: Buffer): { status: number; bodyBytes: number } | null {
  const n = data.length
  if (n < 16) return null
  for (let k = 0; k < 9; k++) if (data[k] !== HTTP11[k]) return null
  const d0 = data[9]! - 48
  const d1 = data[10]! - 48
  const d2 = data[11]! - 48
  if (d0 < 2 || d0 > 5 || d1 < 0 || d1 > 9 || d2 < 0 || d2 > 9) return null
  const status = d0 * 100 + d1 * 10 + d2
  if (status === 204 || status === 304) return null
  if (data[12] !== SP && data[12] !== CR) return null
  let i = 12
  while (i < n && data[i] !== CR) {
    if (notText(data[i]!)) return null
    i++
  }
  if (data[i + 1] !== LF) return null
  i += 2
  let length = -1
  for (;;) {
    if (i + 1 >= n) return null
    if (data[i] === CR) {
      if (data[i + 1] !== LF) return null
      i += 2
      break
    }
    const start = i
    // The name: token characters up to the colon.
    while (i < n && TCHAR[data[i]!] === 1) i++
    if (i === start || i === n || data[i] !== 58) return null
    const colon = i
    // The value: up to CR, which must be followed by LF.
    for (i++; i < n; i++) {
      const c = data[i]!
      if (c < 32 || c === 127) {
        if (c === CR) break
        if (c !== HTAB) return null
      }
    }
    if (i + 1 >= n || data[i + 1] !== LF) return null
    const eol = i
    i += 2
    const first = data[start]! | 0x20
    // Only names starting with c, k, p, t or u can matter.
    if (first !== 99 && first !== 107 && first !== 112 && first !== 116 && first !== 117) continue
    for (const name of NOT_VERBATIM) if (nameIs(data, start, colon, name)) return null
    let v = colon + 1
    while (v < eol && (data[v] === SP || data[v] === HTAB)) v++
    if (nameIs(data, start, colon, CONTENT_LENGTH)) {
      if (length >= 0 || v === eol) return null
      length = 0
      for (; v < eol; v++) {
        const c = data[v]!
        if (c === SP || c === HTAB) break
        if (c < 48 || c > 57 || length > 1e12) return null
        length = length * 10 + (c - 48)
      }
      while (v < eol && (data[v] === SP || data[v] === HTAB)) v++
      if (v !== eol) return null
    } else if (nameIs(data, start, colon, CONTENT_TYPE)) {
      if (eol - v >= EVENT_STREAM.length && nameIs(data, v, v + EVENT_STREAM.length, EVENT_STREAM))
        return null
    }
  }
  if (length < 0 || n !== i + length) return null
  return { status, bodyBytes: length }
}
