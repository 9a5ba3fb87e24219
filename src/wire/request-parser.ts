import { BodyRange } from './body-range.ts'
import { bareLf, CR, DIGITS, FIELD_LINES, hexValue, isOws, LF } from './grammar.ts'

/**
 * RequestParser reads HTTP/1.1 requests from a client connection, incrementally and strictly (RFC 9112).
 * It is the front listener's security boundary: anything two parsers could frame differently (request
 * smuggling) is refused with the status to answer, never repaired. It is also the hot path: a request
 * that arrives whole in one data event is parsed straight from that Buffer — one latin1 decode of the
 * head, the body returned as a range of the pushed bytes, no copy, no view and no concatenation.
 */

export interface RequestHead {
  /** e.g. 'POST' (case-sensitive token, as sent) */
  method: string
  /** request target as received (origin-form '/p?q', '*' for OPTIONS, or absolute-form converted to origin-form) */
  target: string
  /** target before '?' */
  path: string
  /** '' or '?…' (the query including its '?') */
  query: string
  http10: boolean
  /** Content-Length, or -1 when absent (always -1 for chunked) */
  contentLength: number
  chunked: boolean
  /** the connection may carry another request after this one (HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`) */
  keepAlive: boolean
  /** `Expect: 100-continue` was sent (never on HTTP/1.0, which must ignore it: RFC 9110 §10.1.1) */
  expectContinue: boolean
  /** the Connection header value, lower-cased ('' when absent) */
  connection: string
  /**
   * The header fields are not copied out one by one (the hot path forwards them as received and
   * reads one or two): they are ranges of the head text. `text` is the head as received (latin1,
   * request line to the last field line, without the final CRLFCRLF); `fields` holds four indexes
   * per field: line start (= name start), colon, value start and value end (OWS trimmed). `raw`
   * holds the received bytes: text[i] is raw[rawStart + i]. Names are compared in place, ignoring
   * case (nameAt). Use header() and headerPairs() to read them.
   */
  text: string
  fields: number[]
  raw: Buffer
  rawStart: number
}

export interface ParsedRequest {
  head: RequestHead
  /** the whole body (length 0 when none); usually a range of a Buffer given to push(), not a copy */
  body: BodyRange
}

export class RequestError extends Error {
  override readonly name = 'RequestError'
  constructor(
    readonly status: 400 | 408 | 413 | 417 | 431 | 501 | 505,
    message: string,
  ) {
    super(message)
  }
}

export interface ParserLimits {
  maxHeadBytes: number
  maxHeaders: number
  maxBodyBytes: number
  /**
   * bodyLimit, when given, is asked once per request head for the largest body that request may
   * have (e.g. smaller for requests the front relays to the framework than for inference); a
   * larger Content-Length, or a chunked body that grows past it, is refused with 413 before the
   * body is read. It never raises maxBodyBytes.
   */
  bodyLimit?: (head: RequestHead) => number
}

export const DEFAULT_LIMITS: ParserLimits = Object.freeze({
  maxHeadBytes: 64 * 1024,
  maxHeaders: 100,
  maxBodyBytes: 128 * 1024 * 1024,
})

enum State {
  Head,
  /** Content-Length body, or none (need 0) */
  Body,
  Chunked,
}

/** The chunked decoder goes byte by byte through the (tiny) framing and takes data in bulk. */
enum Chunk {
  Size,
  /** whitespace after the size: only allowed before `;ext` (BWS) */
  SizeBws,
  Ext,
  SizeLF,
  Data,
  DataCR,
  DataLF,
  Trailer,
  TrailerLF,
}

/** Empty lines skipped before a request line (RFC 9112 §2.2: some clients send CRLF after a body). */
const MAX_EMPTY_LINES = 4
/** The end of a head, as bytes: a string needle would be encoded again on every search. */
const HEAD_END = Buffer.from('\r\n\r\n', 'latin1')
const CRLF = Buffer.from('\r\n', 'latin1')
// Field lines are checked by one test of the whole block after the request line (FIELD_LINES, the
// same rule the engines' responses are held to). The method is a token.
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
/**
 * Visible ASCII but '#' (a fragment is never sent, and backends disagree about one) and '\\' (URL
 * parsers turn it into '/': the framework would route another path than the one parsed here).
 */
const TARGET = /^[!"$-[\]-~]+$/
/**
 * A dot segment ('.' or '..', also spelled %2e) in a path: URL parsers remove them, so the path
 * routed behind the front would differ from the path parsed and authorised here. Refused, not
 * resolved: no client has a reason to send one.
 */
const DOT_SEGMENT = /\/(?:\.|%2e)(?:\.|%2e)?(?:\/|$)/i
const ABSOLUTE = /^https?:\/\/([^/?]+)(.*)$/i
/**
 * The common Host: a name or dotted address of letters, digits, '-' and '.', with an optional
 * port of 1-5 digits, run from a position of the head text (checked in place on the hot path; a
 * port above 65535 is left to validHost). Anything else goes to the full grammar (validHost).
 */
const HOST_CHARS = /[A-Za-z0-9\-.]+(?::[1-9]\d{0,3})?/y
const HTTP_VERSION = /^HTTP\/\d\.\d$/
/**
 * AUTHORITY: a Host value (or an absolute-form authority) as RFC 9110 §7.2 / RFC 3986 §3.2.2 have
 * it: an IP literal in brackets, or a reg-name (unreserved, sub-delims, well-formed %XX; an IPv4
 * address is one), then an optional port of at most five digits (checked <= 65535 after). Empty is
 * allowed (a request without an authority); a port without a host is not.
 */
const AUTHORITY =
  /^(?:\[[0-9A-Fa-f:.]+\]|\[v[0-9A-Fa-f]+\.[\w\-.~!$&'()*+,;=:]+\]|(?:[\w\-.~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+)(?::(\d{0,5}))?$/
/**
 * The methods this server implements (RFC 9110 §9 less CONNECT and TRACE, plus PATCH). Methods
 * are case-sensitive: `get` is not GET. Anything else is 501, as RFC 9110 §9.1 has it.
 */
const METHODS: ReadonlySet<string> = new Set(['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS'])

/** validHost: an empty Host, or one AUTHORITY accepts with a port <= 65535. */
export function validHost(value: string): boolean {
  if (value === '') return true
  const m = AUTHORITY.exec(value)
  return m !== null && (m[1] === undefined || (m[1] !== '' && Number(m[1]) <= 65535))
}

/** trimOws trims SP and HTAB only (String.trim would also eat NBSP, a legal latin1 value byte). */
function trimOws(s: string): string {
  let a = 0
  let b = s.length
  while (a < b && isOws(s.charCodeAt(a))) a++
  while (b > a && isOws(s.charCodeAt(b - 1))) b--
  return a === 0 && b === s.length ? s : s.slice(a, b)
}

/** hasToken: the lower-cased comma list holds token. */
function hasToken(list: string, token: string): boolean {
  if (list === token) return true
  return list.includes(token) && list.split(',').some((t) => trimOws(t) === token)
}

/**
 * nameAt: text[a, a + name.length) spells the lower-case `name`, ignoring the case of ASCII letters
 * only (a lower-cased copy of every head cost more than the whole field loop).
 */
export function nameAt(text: string, a: number, name: string): boolean {
  for (let i = 0; i < name.length; i++) {
    let c = text.charCodeAt(a + i)
    if (c >= 65 && c <= 90) c |= 0x20
    if (c !== name.charCodeAt(i)) return false
  }
  return true
}

/** header returns the first value of a lower-case header name, or null. */
export function header(head: RequestHead, name: string): string | null {
  const f = head.fields
  for (let k = 0; k < f.length; k += 4)
    if (f[k + 1]! - f[k]! === name.length && nameAt(head.text, f[k]!, name))
      return head.text.slice(f[k + 2]!, f[k + 3]!)
  return null
}

/** headerPairs: every header field in order, names lower-cased, values OWS-trimmed. */
export function headerPairs(head: RequestHead): [string, string][] {
  const f = head.fields
  const pairs: [string, string][] = []
  for (let k = 0; k < f.length; k += 4)
    pairs.push([head.text.slice(f[k]!, f[k + 1]!).toLowerCase(), head.text.slice(f[k + 2]!, f[k + 3]!)])
  return pairs
}

export class RequestParser {
  private readonly maxHead: number
  private readonly maxHeaders: number
  private readonly maxBody: number
  private readonly bodyLimit: ((head: RequestHead) => number) | undefined
  /** The body limit of the request being read (maxBody, or less as bodyLimit says). */
  private limit: number
  /** Pushed buffers not yet consumed: parts[pi] from pos on, then the next ones whole; size bytes in all. */
  private parts: Buffer[] = []
  private pi = 0
  private pos = 0
  private size = 0
  /** A head spanning pushes is gathered here, grown by doubling (a byte-at-a-time head stays O(n)). */
  private acc: Buffer | null = null
  private accLen = 0
  /** Bytes of the head already searched for CRLFCRLF (the search resumes 3 bytes before the end). */
  private scanned = 0
  private state = State.Head
  private head: RequestHead | null = null
  private need = 0
  private cs = Chunk.Size
  private digits = 0
  private remaining = 0
  /** Chunk data bytes held in pieces (at a size line: the sum of the sizes so far). */
  private held = 0
  private pieces: Uint8Array<ArrayBuffer>[] = []
  private lineLen = 0
  /** Chunk extensions and trailers are head-like metadata: together they get maxHeadBytes. */
  private metaLeft = 0

  constructor(limits?: Partial<ParserLimits>) {
    this.maxHead = limits?.maxHeadBytes ?? DEFAULT_LIMITS.maxHeadBytes
    this.maxHeaders = limits?.maxHeaders ?? DEFAULT_LIMITS.maxHeaders
    this.maxBody = limits?.maxBodyBytes ?? DEFAULT_LIMITS.maxBodyBytes
    this.bodyLimit = limits?.bodyLimit
    this.limit = this.maxBody
  }

  /** push appends bytes received on the connection (kept by reference: callers never reuse them). */
  push(data: Buffer): void {
    if (data.length === 0) return
    if (this.pi === this.parts.length) this.parts.length = 0
    else if (this.pi > 0) this.parts.splice(0, this.pi)
    this.pi = 0
    this.parts.push(data)
    this.size += data.length
  }

  /** The request target of the request line being parsed ('' between requests), as sent. */
  private lastTarget = ''
  /** The method of the request line being parsed ('' between requests or before one), as sent. */
  private lastMethodSent = ''

  /**
   * lastMethod: the method of the request line being parsed, even when the request is then refused
   * (a refusal's access line names it); '' between requests, before a request line is whole, or
   * when what stands for it is no token (a malformed method is never written anywhere).
   */
  get lastMethod(): string {
    return TOKEN.test(this.lastMethodSent) ? this.lastMethodSent : ''
  }

  /**
   * lastPath: the path of the request line being parsed ('' between requests), even when the
   * request is then refused: a refusal is rendered in the error shape of its path. Derived only
   * when asked (refusals), not for every request.
   */
  get lastPath(): string {
    const q = this.lastTarget.indexOf('?')
    const sent = q < 0 ? this.lastTarget : this.lastTarget.slice(0, q)
    if (sent === '' || sent.startsWith('/')) return sent
    return sent.replace(/^[a-z][a-z0-9+.-]*:\/\/[^/]*/i, '') || '/'
  }

  /** the head of the request whose body is still arriving (null otherwise) */
  get pendingHead(): RequestHead | null {
    return this.state === State.Head ? null : this.head
  }

  /** bytes received and not yet returned (less a pending request's head and chunk framing) */
  get buffered(): number {
    return this.size + this.accLen + this.held
  }

  /** next returns the next complete request, or null when more bytes are needed; throws RequestError. */
  next(): ParsedRequest | null {
    if (this.state === State.Head && !this.readHead()) return null
    let body = BodyRange.EMPTY
    if (this.state === State.Body) {
      if (this.size < this.need) return null
      if (this.need > 0) body = this.take(this.need)
    } else {
      if (!this.decodeChunks()) return null
      const p = this.pieces
      if (p.length > 0) body = BodyRange.from(p.length === 1 ? p[0]! : Buffer.concat(p, this.held))
      this.pieces = []
      this.held = 0
    }
    const head = this.head!
    this.head = null
    this.state = State.Head
    this.lastTarget = ''
    this.lastMethodSent = ''
    return { head, body }
  }

  private readHead(): boolean {
    const n = this.parts.length - this.pi
    if (this.accLen === 0 && n === 0) return false
    // Fast path: the head starts in the only buffered part; else gather it into acc.
    const fast = this.accLen === 0 && n === 1
    const buf = fast ? this.parts[this.pi]! : this.gather()
    let start = fast ? this.pos : 0
    for (let k = 0; buf[start] === CR && buf[start + 1] === LF; start += 2)
      if (++k > MAX_EMPTY_LINES) throw new RequestError(400, 'too many empty lines')
    const end = buf.indexOf(HEAD_END, start + this.scanned)
    if (end < 0) {
      if (buf.length - start >= this.maxHead) throw this.headTooLarge(buf, start)
      // A head whose lines end in a bare LF never shows CRLFCRLF: refuse it now, not at the timeout.
      if (bareLf(buf, start, start + Math.max(0, this.scanned - 1), buf.length))
        throw new RequestError(400, 'bare LF in request head')
      this.scanned = Math.max(0, buf.length - start - 3)
      return false
    }
    if (end + 4 - start > this.maxHead) throw this.headTooLarge(buf, start)
    const head = this.parseHead(buf.toString('latin1', start, end), buf, start)
    this.scanned = 0
    if (fast) {
      this.size -= end + 4 - this.pos
      this.at(end + 4)
    } else {
      // gather() moved every buffered byte into acc: what follows the head is now the only part.
      this.acc = null
      this.accLen = 0
      this.push(buf.subarray(end + 4))
    }
    this.head = head
    this.limit = this.bodyLimit ? Math.min(this.maxBody, this.bodyLimit(head)) : this.maxBody
    if (!head.chunked && head.contentLength > this.limit)
      throw new RequestError(413, 'request body too large')
    if (head.chunked) {
      this.state = State.Chunked
      this.cs = Chunk.Size
      this.digits = this.remaining = 0
      this.metaLeft = this.maxHead
    } else {
      this.state = State.Body
      this.need = Math.max(0, head.contentLength)
    }
    return true
  }

  /** gather appends every buffered part to acc and returns the filled part of acc. */
  private gather(): Buffer {
    const need = this.accLen + this.size
    if (!this.acc || this.acc.length < need) {
      const grown = Buffer.allocUnsafe(Math.max(need, 2 * (this.acc?.length ?? 0), 1024))
      this.acc?.copy(grown, 0, 0, this.accLen)
      this.acc = grown
    }
    for (let k = this.pi; k < this.parts.length; k++)
      this.accLen += this.parts[k]!.copy(this.acc, this.accLen, k === this.pi ? this.pos : 0)
    this.parts.length = this.pi = this.pos = this.size = 0
    return this.acc.subarray(0, this.accLen)
  }

  /** at moves the read position within parts[pi], on to the next part at its end. */
  private at(pos: number): void {
    if (pos < this.parts[this.pi]!.length) this.pos = pos
    else {
      this.pi++
      this.pos = 0
    }
  }

  /** take consumes n (0 < n <= size) bytes: a range when they lie in one pushed buffer, else one copy. */
  private take(n: number): BodyRange {
    this.size -= n
    const first = this.parts[this.pi]!
    const pos = this.pos
    if (first.length - pos >= n) {
      this.at(pos + n)
      return BodyRange.of(first, pos, pos + n)
    }
    const out = Buffer.allocUnsafe(n)
    for (let w = 0; w < n; ) {
      const p = this.parts[this.pi]!
      const k = p.copy(out, w, this.pos, Math.min(p.length, this.pos + n - w))
      w += k
      this.at(this.pos + k)
    }
    return BodyRange.from(out)
  }

  /**
   * headTooLarge: the 431 for a head over maxHead. Its request line, when received whole, still names
   * the target (lastPath), so the refusal takes the shape of the path it was for.
   */
  private headTooLarge(buf: Buffer, start: number): RequestError {
    const eol = buf.indexOf(CRLF, start)
    if (eol > start) {
      const line = buf.toString('latin1', start, Math.min(eol, start + this.maxHead))
      const sp1 = line.indexOf(' ')
      const sp2 = line.indexOf(' ', sp1 + 1)
      if (sp1 > 0 && sp2 > sp1) {
        this.lastMethodSent = line.slice(0, sp1)
        this.lastTarget = line.slice(sp1 + 1, sp2)
      }
    }
    return new RequestError(431, 'request head too large')
  }

  private parseHead(text: string, raw: Buffer, rawStart: number): RequestHead {
    const n = text.length
    let eol = text.indexOf('\r\n')
    if (eol < 0) eol = n
    const sp1 = text.indexOf(' ')
    const sp2 = text.indexOf(' ', sp1 + 1)
    if (sp1 <= 0 || sp2 < 0 || sp2 > eol) throw new RequestError(400, 'malformed request line')
    let target = text.slice(sp1 + 1, sp2)
    this.lastTarget = target
    // The common methods are recognised in place (a constant, not a new string per request).
    const method =
      sp1 === 4 && text.startsWith('POST')
        ? 'POST'
        : sp1 === 3 && text.startsWith('GET')
          ? 'GET'
          : text.slice(0, sp1)
    this.lastMethodSent = method
    if (method !== 'POST' && method !== 'GET') {
      if (!TOKEN.test(method)) throw new RequestError(400, 'malformed method')
      // CONNECT (a tunnel), TRACE, lower-case spellings and unknown methods: not implemented here.
      if (!METHODS.has(method)) throw new RequestError(501, `method ${method} is not implemented`)
    }
    const exact = eol - sp2 === 9
    const http10 = exact && text.startsWith('HTTP/1.0', sp2 + 1)
    if (!http10 && !(exact && text.startsWith('HTTP/1.1', sp2 + 1))) {
      const version = text.slice(sp2 + 1, eol)
      throw new RequestError(HTTP_VERSION.test(version) ? 505 : 400, 'unsupported HTTP version')
    }
    if (!TARGET.test(target)) throw new RequestError(400, 'malformed request target')
    let authority: string | null = null
    if (target.charCodeAt(0) !== 47) {
      const m = ABSOLUTE.exec(target)
      if (m && validHost(m[1]!)) {
        authority = m[1]!.toLowerCase()
        const rest = m[2]!
        target = rest === '' || rest.charCodeAt(0) === 63 ? '/' + rest : rest
      } else if (target !== '*' || method !== 'OPTIONS')
        throw new RequestError(400, 'unsupported request target')
    }
    FIELD_LINES.lastIndex = eol
    if (!FIELD_LINES.test(text)) throw new RequestError(400, 'malformed header field')
    const fields: number[] = []
    let hosts = 0
    let hostStart = 0
    let hostEnd = 0
    let contentLength = -1
    let clRaw: string | null = null
    let te: string | null = null
    let connection = ''
    let expectContinue = false
    const maxFields = 4 * this.maxHeaders
    for (let a = eol + 2; a < n; a = eol + 2) {
      // FIELD_LINES allowed a CR only as part of a CRLF.
      eol = text.indexOf('\r', a)
      if (eol < 0) eol = n
      if (fields.length === maxFields) throw new RequestError(431, 'too many header fields')
      const colon = text.indexOf(':', a)
      let v = colon + 1
      let e = eol
      while (v < e && isOws(text.charCodeAt(v))) v++
      while (e > v && isOws(text.charCodeAt(e - 1))) e--
      fields.push(a, colon, v, e)
      // The names the parser itself needs, recognised in place (no string per name).
      switch (colon - a) {
        case 4:
          if (nameAt(text, a, 'host')) {
            hosts++
            hostStart = v
            hostEnd = e
          }
          break
        case 14:
          if (nameAt(text, a, 'content-length')) {
            // Repeats must be byte-identical; lists, signs and spaces are refused, never interpreted.
            const value = text.slice(v, e)
            if (clRaw === null) {
              contentLength = Number(value)
              if (!DIGITS.test(value) || !Number.isSafeInteger(contentLength))
                throw new RequestError(400, 'malformed Content-Length')
              clRaw = value
            } else if (value !== clRaw) throw new RequestError(400, 'conflicting Content-Length')
          }
          break
        case 17:
          if (nameAt(text, a, 'transfer-encoding')) {
            const value = text.slice(v, e).toLowerCase()
            te = te === null ? value : `${te},${value}`
          }
          break
        case 10:
          if (nameAt(text, a, 'connection')) {
            const value = text.slice(v, e).toLowerCase()
            connection = connection === '' ? value : `${connection}, ${value}`
          }
          break
        case 6:
          if (nameAt(text, a, 'expect')) {
            if (text.slice(v, e).toLowerCase() !== '100-continue')
              throw new RequestError(417, 'unsupported expectation')
            expectContinue = !http10
          }
          break
      }
    }
    // RFC 9112 §3.2: one Host on HTTP/1.1, never two. An absolute-form authority must agree with it
    // (refused rather than preferred, so nothing downstream routes on a Host we did not check).
    if (hosts > 1 || (hosts === 0 && !http10)) throw new RequestError(400, 'missing or repeated Host')
    if (hosts === 1) {
      // The common Host (name or address, optional port) is checked in place; anything else by
      // the full grammar (IP literals, %-escapes, the port's range).
      HOST_CHARS.lastIndex = hostStart
      if (!HOST_CHARS.test(text) || HOST_CHARS.lastIndex !== hostEnd) {
        if (!validHost(text.slice(hostStart, hostEnd))) throw new RequestError(400, 'bad Host')
      }
      if (authority !== null && text.slice(hostStart, hostEnd).toLowerCase() !== authority)
        throw new RequestError(400, 'bad Host')
    }
    let chunked = false
    if (te !== null) {
      if (http10) throw new RequestError(400, 'Transfer-Encoding on HTTP/1.0')
      if (clRaw !== null) throw new RequestError(400, 'both Content-Length and Transfer-Encoding')
      if (te !== 'chunked') throw new RequestError(501, 'unsupported transfer coding')
      chunked = true
    } else if (contentLength > this.maxBody) throw new RequestError(413, 'request body too large')
    const q = target.indexOf('?')
    const path = q < 0 ? target : target.slice(0, q)
    if (DOT_SEGMENT.test(path)) throw new RequestError(400, 'dot segment in the request target')
    return {
      method,
      target,
      path,
      query: q < 0 ? '' : target.slice(q),
      http10,
      contentLength,
      chunked,
      keepAlive: http10
        ? hasToken(connection, 'keep-alive') && !hasToken(connection, 'close')
        : !hasToken(connection, 'close'),
      expectContinue,
      connection,
      text,
      fields,
      raw,
      rawStart,
    }
  }

  /** decodeChunks runs the chunked decoder over what is buffered; true once the message is complete. */
  private decodeChunks(): boolean {
    while (this.pi < this.parts.length) {
      const buf = this.parts[this.pi]!
      let i = this.pos
      let done = false
      while (i < buf.length && !done) {
        if (this.cs === Chunk.Data) {
          const k = Math.min(this.remaining, buf.length - i)
          this.pieces.push(buf.subarray(i, i + k) as Uint8Array<ArrayBuffer>)
          this.held += k
          i += k
          this.remaining -= k
          if (this.remaining === 0) this.cs = Chunk.DataCR
          continue
        }
        const c = buf[i++]!
        switch (this.cs) {
          case Chunk.Size:
            if (hexValue(c) >= 0) {
              if (++this.digits > 12) throw new RequestError(400, 'chunk size too long')
              this.remaining = this.remaining * 16 + hexValue(c)
              if (this.held + this.remaining > this.limit)
                throw new RequestError(413, 'request body too large')
            } else if (this.digits === 0) throw new RequestError(400, 'missing chunk size')
            else if (c === CR) this.cs = Chunk.SizeLF
            else if (c === 59) this.cs = Chunk.Ext
            else if (isOws(c)) this.cs = Chunk.SizeBws
            else throw new RequestError(400, 'malformed chunk size')
            break
          case Chunk.SizeBws:
            if (c === 59) this.cs = Chunk.Ext
            else if (!isOws(c)) throw new RequestError(400, 'malformed chunk size')
            break
          case Chunk.Ext:
            if (c === CR) this.cs = Chunk.SizeLF
            else if (c === LF) throw new RequestError(400, 'bare LF in chunk extension')
            else if (--this.metaLeft < 0) throw new RequestError(431, 'chunk extensions too large')
            break
          case Chunk.SizeLF:
            if (c !== LF) throw new RequestError(400, 'bare CR in chunk size line')
            this.digits = this.lineLen = 0
            this.cs = this.remaining === 0 ? Chunk.Trailer : Chunk.Data
            break
          case Chunk.DataCR:
            if (c !== CR) throw new RequestError(400, 'chunk data not followed by CRLF')
            this.cs = Chunk.DataLF
            break
          case Chunk.DataLF:
            if (c !== LF) throw new RequestError(400, 'chunk data not followed by CRLF')
            this.cs = Chunk.Size
            break
          case Chunk.Trailer:
            // Trailers are discarded, but still framed strictly: CRLF line ends, no controls.
            if (c === CR) this.cs = Chunk.TrailerLF
            else if ((c < 32 && c !== 9) || c === 127) throw new RequestError(400, 'malformed trailer')
            else if (--this.metaLeft < 0) throw new RequestError(431, 'trailers too large')
            else this.lineLen++
            break
          case Chunk.TrailerLF:
            if (c !== LF) throw new RequestError(400, 'bare CR in trailer')
            done = this.lineLen === 0
            this.lineLen = 0
            this.cs = Chunk.Trailer
            break
        }
      }
      this.size -= i - this.pos
      this.at(i)
      if (done) return true
    }
    return false
  }
}
