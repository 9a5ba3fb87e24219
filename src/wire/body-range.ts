import { type ScanFailure, type ScannedJson, scanJson, type TopKey } from './json-scan.ts'

/**
 * BodyRange: a request body as the bytes [start, end) of a received Buffer, read and copied in
 * place. It is not a view (`subarray`) on purpose: a Buffer fresh from a socket gets its own
 * ArrayBuffer, with a copy of its bytes, the first time anything views it (~220 ns a request,
 * more than the rest of the body's handling on the hot path).
 *
 * The bytes after `end` may be the next pipelined request. The range's bounds stay private and
 * every read goes through these methods, so no caller can forward or parse past the body.
 */
export class BodyRange {
  static readonly EMPTY = new BodyRange(Buffer.alloc(0), 0, 0)

  private constructor(
    private readonly buf: Buffer,
    private readonly start: number,
    private readonly end: number,
  ) {}

  /** of: bytes [start, end) of buf (0 <= start <= end <= buf.length). */
  static of(buf: Buffer, start: number, end: number): BodyRange {
    if (!(start >= 0 && start <= end && end <= buf.length)) throw new RangeError('body range out of bounds')
    return new BodyRange(buf, start, end)
  }

  /** from: the whole of an array (a body read by the framework, or built by a rewrite); not copied. */
  static from(bytes: Uint8Array): BodyRange {
    const buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
    return new BodyRange(buf, 0, buf.length)
  }

  get length(): number {
    return this.end - this.start
  }

  /**
   * text: the body decoded as UTF-8 (malformed sequences as U+FFFD), a leading byte-order mark
   * skipped as TextDecoder and the engine's JSON reader (Python's json.loads on bytes) skip it.
   */
  text(): string {
    const b = this.buf
    let a = this.start
    if (this.end - a >= 3 && b[a] === 0xef && b[a + 1] === 0xbb && b[a + 2] === 0xbf) a += 3
    return b.toString('utf8', a, this.end)
  }

  /** copyTo writes the body into target at pos; returns the number of bytes written. */
  copyTo(target: Uint8Array, pos: number): number {
    return this.buf.copy(target, pos, this.start, this.end)
  }

  /**
   * nestedDeeperThan: the body, read as JSON text, opens more than `max` arrays or objects inside one
   * another (brackets inside strings do not count). One pass over the bytes, no parse: it runs
   * before a body is parsed or validated, whose recursive descent is what a deep body attacks.
   */
  nestedDeeperThan(max: number): boolean {
    const b = this.buf
    let depth = 0
    let inString = false
    for (let i = this.start; i < this.end; i++) {
      const c = b[i]!
      if (inString) {
        if (c === 0x5c) i++
        else if (c === 0x22) inString = false
      } else if (c === 0x22) inString = true
      else if (c === 0x5b || c === 0x7b) {
        if (++depth > max) return true
      } else if (c === 0x5d || c === 0x7d) depth--
    }
    return false
  }

  /** scanJson: the body validated as a JSON object and its routing fields located, in place (json-scan.ts). */
  scanJson(maxDepth: number): ScannedJson | ScanFailure {
    return scanJson(this.buf, this.start, this.end, maxDepth)
  }

  /**
   * splice: a copy of the body with the bytes of `span` (absolute indexes, as a scanJson span of
   * this body gives them) replaced by `value`.
   */
  splice(span: readonly [number, number], value: Uint8Array): BodyRange {
    const [a, b] = span
    if (!(this.start <= a && a <= b && b <= this.end)) throw new RangeError('splice span out of the body')
    const out = Buffer.allocUnsafe(this.end - this.start - (b - a) + value.length)
    this.buf.copy(out, 0, this.start, a)
    out.set(value, a - this.start)
    this.buf.copy(out, a - this.start + value.length, b, this.end)
    return new BodyRange(out, 0, out.length)
  }

  /**
   * spliceScanned: splice, with the body's scan moved onto the copy (ScannedJson.spliced): a second
   * splice (the served model name) can use it without scanning the body again. `added`: a top-level
   * key the value brings, its value at [from, to) of `value`.
   */
  spliceScanned(
    json: ScannedJson,
    span: readonly [number, number],
    value: Uint8Array,
    added?: { key: TopKey; from: number; to: number },
  ): { body: BodyRange; json: ScannedJson } {
    const body = this.splice(span, value)
    const at = span[0] - this.start
    const key = added ? { key: added.key, at: at + added.from, end: at + added.to } : undefined
    return { body, json: json.spliced(body.buf, this.start, span[0], span[1], value.length, key) }
  }

  /** bytes: the body as an array (itself when the range is all of it, else a view), for the rare paths that need one. */
  bytes(): Uint8Array<ArrayBuffer> {
    const b = this.buf
    if (this.start === 0 && this.end === b.length) return b as Uint8Array<ArrayBuffer>
    return b.subarray(this.start, this.end) as Uint8Array<ArrayBuffer>
  }
}
