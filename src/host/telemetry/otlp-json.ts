import {
  type AttributeList,
  type AttributeValue,
  attributeList,
  type SpanAttributes,
  type SpanRecord,
} from './record.ts'

/**
 * OTLP/HTTP with OTLP's JSON encoding (https://opentelemetry.io/docs/specs/otlp/): one
 * ExportTraceServiceRequest per batch, `POST <endpoint>/v1/traces`, `application/json`: hex ids,
 * kind and status codes as OTLP's enums, times as decimal nanoseconds, 64-bit integers as strings
 * (the protobuf JSON mapping). The resource and scope, the same for every span of the process, are
 * written once.
 *
 * A batch is written as bytes into one reused buffer, the way the exchange writes a request (no
 * string per field: building the text with strings cost about 10 µs a span in the proxy), and sent
 * as a copy of those bytes. A string is copied byte for byte when it needs no escaping (ids, names,
 * routes, addresses, almost every model name); anything else goes through JSON.stringify.
 */
export class OtlpJsonEncoder {
  private readonly head: Uint8Array
  private buf = Buffer.allocUnsafe(256 * 1024)
  private pos = 0

  constructor(resource: SpanAttributes, scope: { name: string; version: string }) {
    this.raw('{"resourceSpans":[{"resource":{"attributes":[')
    this.attributes(attributeList(resource))
    this.raw(']},"scopeSpans":[{"scope":{"name":')
    this.str(scope.name)
    this.raw(',"version":')
    this.str(scope.version)
    this.raw('},"spans":[')
    this.head = Buffer.from(this.buf.subarray(0, this.pos))
  }

  /** encode: the request carrying `spans`, as bytes of its own. */
  encode(spans: readonly SpanRecord[]): Uint8Array<ArrayBuffer> {
    this.pos = 0
    this.ensure(this.head.length)
    this.buf.set(this.head, 0)
    this.pos = this.head.length
    for (let i = 0; i < spans.length; i++) {
      if (i > 0) this.byte(COMMA)
      this.span(spans[i]!)
    }
    this.raw(']}]}]}')
    return Buffer.from(this.buf.subarray(0, this.pos))
  }

  private span(s: SpanRecord): void {
    this.raw('{"traceId":"')
    this.raw(s.traceId)
    this.raw('","spanId":"')
    this.raw(s.spanId)
    if (s.parentSpanId) {
      this.raw('","parentSpanId":"')
      this.raw(s.parentSpanId)
    }
    this.raw('","name":')
    this.str(s.name)
    this.raw(',"kind":')
    this.int(s.kind)
    this.raw(',"startTimeUnixNano":')
    this.nanos(s.start)
    this.raw(',"endTimeUnixNano":')
    this.nanos(s.end)
    this.raw(',"attributes":[')
    this.attributes(s.attributes)
    this.raw('],"events":[')
    if (s.events !== null)
      for (let i = 0; i < s.events.length; i++) {
        const e = s.events[i]!
        this.raw(i > 0 ? ',{"timeUnixNano":' : '{"timeUnixNano":')
        this.nanos(e.time)
        this.raw(',"name":')
        this.str(e.name)
        this.raw(',"attributes":[')
        if (e.attributes) this.attributes(attributeList(e.attributes))
        this.raw(']}')
      }
    this.raw('],"status":{')
    if (s.status !== 0) {
      this.raw('"code":')
      this.int(s.status)
      this.raw(',"message":')
      this.str(s.statusMessage)
    }
    this.raw('}}')
  }

  private attributes(list: AttributeList): void {
    for (let i = 0; i < list.length; i += 2) {
      if (i > 0) this.byte(COMMA)
      const key = list[i] as string
      let head = KEY_HEADS.get(key)
      if (head === undefined) {
        head = Buffer.from(`{"key":${JSON.stringify(key)},"value":`, 'utf8')
        if (KEY_HEADS.size < 1024) KEY_HEADS.set(key, head)
      }
      this.ensure(head.length)
      this.buf.set(head, this.pos)
      this.pos += head.length
      this.anyValue(list[i + 1]!)
      this.byte(CLOSE)
    }
  }

  /** anyValue: an attribute value as OTLP's AnyValue. */
  private anyValue(v: AttributeValue): void {
    switch (typeof v) {
      case 'string':
        this.raw('{"stringValue":')
        this.str(v)
        break
      case 'number':
        if (Number.isInteger(v)) {
          this.raw('{"intValue":"')
          this.int(v)
          this.byte(QUOTE)
        } else {
          this.raw('{"doubleValue":')
          this.raw(Number.isFinite(v) ? String(v) : `"${v}"`)
        }
        break
      case 'boolean':
        this.raw(v ? '{"boolValue":true' : '{"boolValue":false')
        break
      default:
        this.raw('{"arrayValue":{"values":[')
        for (let i = 0; i < v.length; i++) {
          if (i > 0) this.byte(COMMA)
          this.anyValue(v[i]!)
        }
        this.raw(']}')
    }
    this.byte(CLOSE)
  }

  private ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.pos + n))
    this.buf.copy(next, 0, 0, this.pos)
    this.buf = next
  }

  private byte(b: number): void {
    this.ensure(1)
    this.buf[this.pos++] = b
  }

  /** raw: text that is JSON already, in ASCII (the encoding's own punctuation, hex ids, digits). */
  private raw(s: string): void {
    this.ensure(s.length)
    const buf = this.buf
    let pos = this.pos
    for (let i = 0; i < s.length; i++) buf[pos++] = s.charCodeAt(i)
    this.pos = pos
  }

  /** str: a JSON string: its bytes as they are when nothing needs escaping, else JSON.stringify's. */
  private str(s: string): void {
    this.ensure(s.length + 2)
    const buf = this.buf
    const start = this.pos
    let pos = start
    buf[pos++] = QUOTE
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i)
      if (c < 0x20 || c > 0x7e || c === QUOTE || c === BACKSLASH) {
        const escaped = JSON.stringify(s)
        this.pos = start
        this.ensure(escaped.length * 3)
        this.pos += this.buf.write(escaped, start, 'utf8')
        return
      }
      buf[pos++] = c
    }
    buf[pos++] = QUOTE
    this.pos = pos
  }

  /** int: a safe integer in decimal (int32 arithmetic below 2^31, the usual case). */
  private int(n: number): void {
    if (n < 0) {
      this.byte(MINUS)
      n = -n
    }
    if (n >= 0x80000000) {
      // Split so that both halves are small integers: the digits above the last nine, then those nine.
      const high = Math.floor(n / 1e9)
      this.int(high)
      this.digits(n - high * 1e9, 9)
      return
    }
    let width = 1
    for (let v = n; v >= 10; v = (v / 10) | 0) width++
    this.digits(n, width)
  }

  /** digits: a small non-negative integer as exactly `width` digits (zeros in front). */
  private digits(n: number, width: number): void {
    this.ensure(width)
    const buf = this.buf
    let v = n | 0
    for (let i = this.pos + width - 1; i >= this.pos; i--) {
      const q = (v / 10) | 0
      buf[i] = 48 + v - q * 10
      v = q
    }
    this.pos += width
  }

  /** nanos: epoch milliseconds (to the microsecond) as a string of decimal nanoseconds (beyond 2^53). */
  private nanos(ms: number): void {
    let whole = Math.floor(ms)
    let micros = Math.round((ms - whole) * 1000)
    if (micros >= 1000) {
      whole += 1
      micros -= 1000
    }
    this.byte(QUOTE)
    if (whole > 0) {
      this.int(whole)
      this.digits(micros, 3)
      this.raw('000"')
    } else {
      this.int(micros * 1000)
      this.byte(QUOTE)
    }
  }
}

/** KEY_HEADS: each attribute key's `{"key":…,"value":` bytes (modelgate's keys are a few dozen names). */
const KEY_HEADS = new Map<string, Buffer>()

const QUOTE = 0x22
const BACKSLASH = 0x5c
const COMMA = 0x2c
const CLOSE = 0x7d
const MINUS = 0x2d

/**
 * sendOtlp posts one encoded request to the collector within `timeoutMs`; anything but a 2xx is an
 * error (the caller drops the batch and reports it). The answer is read whole, so the connection
 * is reused for the next batch.
 */
export async function sendOtlp(
  url: string,
  headers: Record<string, string>,
  body: Uint8Array<ArrayBuffer>,
  timeoutMs: number,
): Promise<void> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { ...headers, 'content-type': 'application/json' },
    body,
    signal: AbortSignal.timeout(timeoutMs),
  })
  const text = await res.text()
  if (!res.ok) throw new Error(`the collector answered ${res.status}: ${text.slice(0, 200)}`)
}
