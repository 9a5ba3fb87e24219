/**
 * scanJson validates a request body as JSON (RFC 8259, as strictly as the engines' own parsers) in
 * one pass over its bytes and records where the values of a few top-level keys are, without
 * building a JS value for anything. An inference body is forwarded as the bytes the client sent,
 * so routing only ever needs `model` and a flag or two from it; parsing it whole (JSON.parse) let a
 * 20 MB body of nested arrays cost ~800 MB of memory before anything could refuse it. Here the
 * memory used is constant whatever the body (a stack of maxDepth bytes), nesting deeper than
 * `maxDepth` is refused where it starts, and a body that is not JSON is refused, as the engine
 * would refuse it.
 *
 * A key spelled with escapes (`"mod\u0065l"`) is the same key, and when a key repeats the last
 * value counts, as JSON.parse and Python's json.loads read it.
 */

/** The top-level keys whose values a scan records. */
const TOP_KEYS = [
  'model',
  'max_tokens',
  'max_completion_tokens',
  'max_output_tokens',
  'n',
  'stream',
  'stream_options',
] as const
export type TopKey = (typeof TOP_KEYS)[number]

/** Why a body was refused: not JSON, nested too deep, or JSON whose top level is not an object. */
export type ScanFailure = 'invalid' | 'too_deep' | 'not_object'

const encoder = new TextEncoder()
const KEY_BYTES = TOP_KEYS.map((k) => encoder.encode(`"${k}"`))

const QUOTE = 0x22
const BACKSLASH = 0x5c
const COMMA = 0x2c
const COLON = 0x3a
const OPEN_OBJ = 0x7b
const CLOSE_OBJ = 0x7d
const OPEN_ARR = 0x5b
const CLOSE_ARR = 0x5d

/** ESCAPE[b]: 1 for the bytes a backslash may precede besides `u`. */
const ESCAPE = new Uint8Array(256)
for (const c of '"\\/bfnrt') ESCAPE[c.charCodeAt(0)] = 1
/** PLAIN[b]: 1 for bytes that stand for themselves inside a string (not '"', '\\' or a control). */
const PLAIN = new Uint8Array(256).fill(1)
for (let b = 0; b < 0x20; b++) PLAIN[b] = 0
PLAIN[0x22] = 0
PLAIN[0x5c] = 0
const HEX = new Uint8Array(256)
for (const c of '0123456789abcdefABCDEF') HEX[c.charCodeAt(0)] = 1
const LITERALS = [encoder.encode('true'), encoder.encode('false'), encoder.encode('null')]

// What may come next between tokens.
const VALUE = 0
/** after '[': a value or ']' */
const VALUE_OR_CLOSE = 1
/** after '{': a key or '}' */
const KEY_OR_CLOSE = 2
/** after ',' in an object */
const KEY = 3
const AFTER_KEY = 4
/** after a value: ',' or the container's close (at the top level: only whitespace) */
const AFTER = 5

/**
 * ScannedJson: a body that scanned as a JSON object, with the spans of its recorded top-level
 * values. Values are read only when asked for, from the bytes in place.
 */
export class ScannedJson {
  constructor(
    private readonly buf: Buffer,
    /** [start, end) per TOP_KEYS index, absolute in buf; -1 when the key is absent. */
    private readonly spans: Int32Array,
  ) {}

  has(key: TopKey): boolean {
    return this.spans[TOP_KEYS.indexOf(key) * 2]! >= 0
  }

  /** string: the key's value when it is a JSON string, else undefined (absent or another type). */
  string(key: TopKey): string | undefined {
    const k = TOP_KEYS.indexOf(key) * 2
    const a = this.spans[k]!
    const b = this.spans[k + 1]!
    if (a < 0 || this.buf[a] !== QUOTE) return undefined
    // Read in place: a view of a Buffer fresh from a socket would copy it (see BodyRange).
    if (!hasBackslash(this.buf, a + 1, b - 1)) return this.buf.toString('utf8', a + 1, b - 1)
    return JSON.parse(this.buf.toString('utf8', a, b)) as string
  }

  /** value: the key's value parsed (small scalars such as max_tokens), or undefined when absent. */
  value(key: TopKey): unknown {
    const k = TOP_KEYS.indexOf(key) * 2
    const a = this.spans[k]!
    if (a < 0) return undefined
    return JSON.parse(this.buf.toString('utf8', a, this.spans[k + 1]!))
  }

  /** span: [start, end) of the key's value in the scanned buffer (quotes included), or null. */
  span(key: TopKey): readonly [number, number] | null {
    const k = TOP_KEYS.indexOf(key) * 2
    const a = this.spans[k]!
    return a < 0 ? null : [a, this.spans[k + 1]!]
  }

  /** bytesAre: the bytes of `span` (from this scan) are exactly `bytes` (e.g. a literal `true`). */
  bytesAre(span: readonly [number, number], bytes: Uint8Array): boolean {
    const [a, b] = span
    if (b - a !== bytes.length) return false
    for (let i = 0; i < bytes.length; i++) if (this.buf[a + i] !== bytes[i]) return false
    return true
  }

  /**
   * spliced: this scan moved onto `buf`, a copy of the body that started at `base` in this scan's
   * buffer with bytes [a, b) replaced by `length` bytes: the spans after the splice shift, the
   * replaced one (if recorded) covers the new bytes, and `added` (a key the new bytes bring, its value's
   * span in `buf`) is recorded. No second scan of the body.
   */
  spliced(
    buf: Buffer,
    base: number,
    a: number,
    b: number,
    length: number,
    added?: { key: TopKey; at: number; end: number },
  ): ScannedJson {
    const spans = new Int32Array(this.spans.length)
    const shift = length - (b - a)
    for (let k = 0; k < spans.length; k += 2) {
      const s = this.spans[k]!
      const e = this.spans[k + 1]!
      if (s < 0) spans.set([-1, -1], k)
      else if (s >= b && s > a) spans.set([s - base + shift, e - base + shift], k)
      else if (e <= a) spans.set([s - base, e - base], k)
      else spans.set([a - base, a - base + length], k)
    }
    if (added) spans.set([added.at, added.end], TOP_KEYS.indexOf(added.key) * 2)
    return new ScannedJson(buf, spans)
  }
}

/** The container stack, shared by every scan (a scan runs to its end synchronously). */
let stackBuf = new Uint8Array(65)

/** scanJson: `buf[start, end)` read as one JSON object (a leading UTF-8 byte-order mark is skipped). */
export function scanJson(
  buf: Buffer,
  start: number,
  end: number,
  maxDepth: number,
): ScannedJson | ScanFailure {
  let i = start
  if (end - i >= 3 && buf[i] === 0xef && buf[i + 1] === 0xbb && buf[i + 2] === 0xbf) i += 3
  const spans = new Int32Array(TOP_KEYS.length * 2).fill(-1)
  /** The kind of each open container (1 object, 2 array), by depth; the only state that grows. */
  if (stackBuf.length <= maxDepth) stackBuf = new Uint8Array(maxDepth + 1)
  const stack = stackBuf
  let depth = 0
  let expect = VALUE
  let topIsObject = false
  /** The recorded key whose value comes next at depth 1, then the one being read (-1: none). */
  let pendingKey = -1
  let recKey = -1
  let recStart = 0
  while (i < end) {
    const c = buf[i]!
    if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) {
      i++
      continue
    }
    if (expect === AFTER) {
      if (depth === 0) return 'invalid'
      const kind = stack[depth]
      if (c === COMMA) {
        i++
        expect = kind === 1 ? KEY : VALUE
        continue
      }
      if (!((c === CLOSE_OBJ && kind === 1) || (c === CLOSE_ARR && kind === 2))) return 'invalid'
      depth--
      i++
    } else if (expect === KEY_OR_CLOSE || expect === KEY) {
      if (c === CLOSE_OBJ && expect === KEY_OR_CLOSE) {
        depth--
        i++
      } else {
        if (c !== QUOTE) return 'invalid'
        const e = stringEnd(buf, i, end)
        if (e < 0) return 'invalid'
        if (depth === 1) pendingKey = keyIndex(buf, i, e)
        i = e
        expect = AFTER_KEY
        continue
      }
    } else if (expect === AFTER_KEY) {
      if (c !== COLON) return 'invalid'
      i++
      expect = VALUE
      continue
    } else {
      // VALUE or VALUE_OR_CLOSE
      if (c === CLOSE_ARR && expect === VALUE_OR_CLOSE) {
        depth--
        i++
      } else {
        if (pendingKey >= 0) {
          recKey = pendingKey
          recStart = i
          pendingKey = -1
        }
        if (c === OPEN_OBJ || c === OPEN_ARR) {
          if (depth >= maxDepth) return 'too_deep'
          stack[++depth] = c === OPEN_OBJ ? 1 : 2
          if (depth === 1) topIsObject = c === OPEN_OBJ
          expect = c === OPEN_OBJ ? KEY_OR_CLOSE : VALUE_OR_CLOSE
          i++
          continue
        }
        const e = scalarEnd(buf, i, end)
        if (e < 0) return 'invalid'
        i = e
      }
    }
    // A value ended at i (a scalar, or a container's close).
    if (recKey >= 0 && depth === 1) {
      spans[recKey * 2] = recStart
      spans[recKey * 2 + 1] = i
      recKey = -1
    }
    expect = AFTER
  }
  if (expect !== AFTER || depth !== 0) return 'invalid'
  return topIsObject ? new ScannedJson(buf, spans) : 'not_object'
}

/** stringEnd: the index just past the closing quote of the string opening at i, or -1 if malformed. */
function stringEnd(buf: Uint8Array, i: number, end: number): number {
  let k = i + 1
  while (k < end) {
    if (PLAIN[buf[k]!] === 1) {
      k++
      continue
    }
    const c = buf[k]!
    if (c === QUOTE) return k + 1
    if (c === BACKSLASH) {
      const n = buf[k + 1]!
      if (k + 1 < end && ESCAPE[n] === 1) k += 2
      else if (
        n === 0x75 &&
        k + 5 < end &&
        HEX[buf[k + 2]!] === 1 &&
        HEX[buf[k + 3]!] === 1 &&
        HEX[buf[k + 4]!] === 1 &&
        HEX[buf[k + 5]!] === 1
      )
        k += 6
      else return -1
    } else return -1
  }
  return -1
}

/** scalarEnd: the index just past the string, number or literal starting at i, or -1. */
function scalarEnd(buf: Uint8Array, i: number, end: number): number {
  const c = buf[i]!
  if (c === QUOTE) return stringEnd(buf, i, end)
  if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return numberEnd(buf, i, end)
  for (const lit of LITERALS) {
    if (c !== lit[0]) continue
    if (i + lit.length > end) return -1
    for (let k = 1; k < lit.length; k++) if (buf[i + k] !== lit[k]) return -1
    return i + lit.length
  }
  return -1
}

/** numberEnd: `-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?` from i; -1 when malformed. */
function numberEnd(buf: Uint8Array, i: number, end: number): number {
  let k = i
  if (buf[k] === 0x2d) k++
  if (k >= end) return -1
  if (buf[k] === 0x30) k++
  else {
    const d = k
    while (k < end && isDigit(buf[k]!)) k++
    if (k === d) return -1
  }
  if (k < end && buf[k] === 0x2e) {
    const d = ++k
    while (k < end && isDigit(buf[k]!)) k++
    if (k === d) return -1
  }
  if (k < end && (buf[k] === 0x65 || buf[k] === 0x45)) {
    k++
    if (k < end && (buf[k] === 0x2b || buf[k] === 0x2d)) k++
    const d = k
    while (k < end && isDigit(buf[k]!)) k++
    if (k === d) return -1
  }
  return k
}

function isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39
}

/** keyIndex: which recorded key the string buf[a, b) (quotes included) spells, or -1. */
function keyIndex(buf: Buffer, a: number, b: number): number {
  const len = b - a
  for (let k = 0; k < KEY_BYTES.length; k++) {
    const key = KEY_BYTES[k]!
    if (key.length !== len) continue
    let same = true
    for (let j = 1; j < len - 1; j++)
      if (buf[a + j] !== key[j]) {
        same = false
        break
      }
    if (same) return k
  }
  if (!hasBackslash(buf, a + 1, b - 1)) return -1
  const name = JSON.parse(buf.toString('utf8', a, b)) as string
  return (TOP_KEYS as readonly string[]).indexOf(name)
}

function hasBackslash(buf: Uint8Array, a: number, b: number): boolean {
  for (let j = a; j < b; j++) if (buf[j] === BACKSLASH) return true
  return false
}
