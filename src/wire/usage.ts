import type { BodyRange } from './body-range.ts'
import type { ScannedJson } from './json-scan.ts'

/**
 * The engine's own token counts of a request, read from its response as it passes through the
 * front, never by buffering or parsing what the front would not otherwise hold: a plain JSON reply
 * is held whole anyway (exchange.ts) and carries `usage` at its top level; an event stream carries
 * it in its last chunk when the request asked for it (`stream_options: {include_usage: true}`), so
 * a streamed request that did not ask is made to ask (askForUsage, a splice of the body like
 * model-field.ts's) and that chunk is taken out of what its client receives (UsageStream, strip).
 *
 * This is the one reader of `usage` on the request path: inference keys count it (src/http/keys/),
 * a traced request's span reports it, and anything else that needs the counts reads
 * ForwardEnd.usage. For a span it also reads each choice's `finish_reason` (finishReasons, and
 * UsageStream's `reasons`), from the same bytes.
 */
export interface TokenUsage {
  prompt: number
  completion: number
}

/** UsageMode: how a forward reads usage: `read` it, or read it and `strip` the usage-only chunk of a stream. */
export type UsageMode = 'read' | 'strip'

const KEY = Buffer.from('"usage"')
const FINISH_KEY = Buffer.from('"finish_reason"')
/** The usual reasons, as shared strings (no string made per answer for them). */
const REASONS = ['stop', 'length', 'abort', 'tool_calls', 'content_filter'].map((r) => ({
  text: r,
  bytes: Buffer.from(r, 'latin1'),
}))
const CHOICES = Buffer.from('"choices"')
const QUOTE = 0x22
const BACKSLASH = 0x5c
const COLON = 0x3a
const OPEN = 0x7b
const CLOSE = 0x7d
const LF = 0x0a
/** The largest `usage` object read (an engine's is a few hundred bytes). */
const MAX_USAGE_BYTES = 4096

function isSpace(c: number | undefined): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09
}

/** skipSpace: the index of the first non-space byte from i (up to end). */
function skipSpace(buf: Uint8Array, i: number, end: number): number {
  while (i < end && isSpace(buf[i])) i++
  return i
}

/**
 * usageAt: the usage object whose `"usage"` key starts at i (within [i, end)), or null when the key
 * is not followed by an object with a prompt_tokens count (e.g. `"usage": null` in a chunk).
 */
function usageAt(buf: Buffer, i: number, end: number): TokenUsage | null {
  let k = skipSpace(buf, i + KEY.length, end)
  if (buf[k] !== COLON) return null
  k = skipSpace(buf, k + 1, end)
  if (buf[k] !== OPEN) return null
  return countsOf(buf, k, Math.min(end, k + MAX_USAGE_BYTES))
}

const PROMPT = 'prompt_tokens'
const COMPLETION = 'completion_tokens'

/**
 * countsOf: the counts of the usage object opening at buf[a] (within [a, b)), read in place in one
 * pass (the request path parses no JSON for it): its own `prompt_tokens` and `completion_tokens`
 * when they are non-negative integers (nested objects, such as the details, are skipped); null
 * when the object does not close, or has no prompt_tokens count.
 */
function countsOf(buf: Buffer, a: number, b: number): TokenUsage | null {
  let prompt = -1
  let completion = -1
  let depth = 0
  let k = a
  while (k < b) {
    const c = buf[k]!
    if (c === QUOTE) {
      const close = stringClose(buf, k, b)
      if (close < 0) return null
      if (depth === 1) {
        const which = keyIs(buf, k + 1, close, PROMPT) ? 1 : keyIs(buf, k + 1, close, COMPLETION) ? 2 : 0
        let v = skipSpace(buf, close + 1, b)
        if (which !== 0 && buf[v] === COLON) {
          v = skipSpace(buf, v + 1, b)
          let n = 0
          let digits = 0
          while (v < b && buf[v]! >= 0x30 && buf[v]! <= 0x39 && digits < 16) {
            n = n * 10 + (buf[v]! - 0x30)
            digits++
            v++
          }
          const after = buf[skipSpace(buf, v, b)]
          if (digits > 0 && (after === 0x2c || after === CLOSE)) {
            if (which === 1) prompt = n
            else completion = n
          }
          k = v
          continue
        }
      }
      k = close + 1
    } else {
      if (c === OPEN || c === 0x5b) depth++
      else if (c === CLOSE || c === 0x5d) {
        if (--depth === 0) return prompt < 0 ? null : { prompt, completion: Math.max(0, completion) }
      }
      k++
    }
  }
  return null
}

/** stringClose: the index of the quote closing the string that opens at i, or -1 before b. */
function stringClose(buf: Uint8Array, i: number, b: number): number {
  for (let k = i + 1; k < b; k++) {
    const c = buf[k]
    if (c === BACKSLASH) k++
    else if (c === QUOTE) return k
  }
  return -1
}

/** keyIs: buf[a, b) is exactly the ASCII `key`. */
function keyIs(buf: Uint8Array, a: number, b: number, key: string): boolean {
  if (b - a !== key.length) return false
  for (let i = 0; i < key.length; i++) if (buf[a + i] !== key.charCodeAt(i)) return false
  return true
}

/**
 * readUsage: the `usage` of a JSON body in buf[start, end): the last `"usage"` key followed by an
 * object (an engine puts it at the top level, after the choices). A `"usage"` inside a string cannot
 * be mistaken for it: a quote inside a JSON string is escaped, so the key's closing quote could not be.
 */
export function readUsage(buf: Buffer, start: number, end: number): TokenUsage | null {
  if (end - start < KEY.length) return null
  let i = buf.lastIndexOf(KEY, end - KEY.length)
  while (i >= start) {
    if (buf[i - 1] !== BACKSLASH) {
      const u = usageAt(buf, i, end)
      if (u) return u
    }
    if (i === 0) break
    i = buf.lastIndexOf(KEY, i - 1)
  }
  return null
}

/**
 * finishReasons: every `"finish_reason": "<reason>"` in buf[start, end), in order, appended to `out`
 * (null ones left out). A quote inside a generated text is escaped, so only keys match.
 */
export function finishReasons(buf: Buffer, start: number, end: number, out: string[] = []): string[] {
  let at = buf.indexOf(FINISH_KEY, start)
  while (at >= 0 && at < end) {
    let v = skipSpace(buf, at + FINISH_KEY.length, end)
    if (buf[v] === COLON) {
      v = skipSpace(buf, v + 1, end)
      if (buf[v] === QUOTE) {
        const close = buf.indexOf(QUOTE, v + 1)
        // A reason is a short plain word (stop, length, abort, tool_calls...).
        if (close > v && close < end && close - v <= 64 && buf[close - 1] !== BACKSLASH)
          out.push(reasonAt(buf, v + 1, close))
      }
    }
    at = buf.indexOf(FINISH_KEY, at + FINISH_KEY.length)
  }
  return out
}

/** reasonAt: the finish reason in buf[from, to), one of REASONS' strings when it is one of them. */
function reasonAt(buf: Buffer, from: number, to: number): string {
  next: for (const r of REASONS) {
    if (r.bytes.length !== to - from) continue
    for (let i = 0; i < r.bytes.length; i++) if (buf[from + i] !== r.bytes[i]) continue next
    return r.text
  }
  return buf.toString('latin1', from, to)
}

const TRUE = Buffer.from('true')
const encoder = new TextEncoder()
const INSERTED = encoder.encode(',"stream_options":{"include_usage":true}')
/** Where the inserted stream_options value starts (after `,"stream_options":`). */
const INSERTED_VALUE = INSERTED.indexOf(0x7b)

/**
 * askForUsage: a streamed request (`"stream": true`) made to ask the engine for the usage chunk, if
 * it does not already: `stream_options.include_usage` set to true by a splice (inserted after
 * `stream`'s value, or the existing `stream_options` object rewritten with it), every other byte as
 * the client sent it. `strip`: the client did not ask, so the chunk must not reach it. A request that
 * is not streamed, or whose `stream_options` is not an object (the engine will refuse it), is left as
 * it is.
 */
export function askForUsage(
  body: BodyRange,
  json: ScannedJson,
): { body: BodyRange; json: ScannedJson; strip: boolean } {
  const same = { body, json, strip: false }
  const stream = json.span('stream')
  if (!stream || !json.bytesAre(stream, TRUE)) return same
  const opts = json.span('stream_options')
  if (!opts) {
    const at: readonly [number, number] = [stream[1], stream[1]]
    const added = { key: 'stream_options' as const, from: INSERTED_VALUE, to: INSERTED.length }
    return { ...body.spliceScanned(json, at, INSERTED, added), strip: true }
  }
  if (opts[1] - opts[0] > MAX_USAGE_BYTES) return same
  let value: unknown
  try {
    value = json.value('stream_options')
  } catch {
    return same
  }
  if (value !== null && (typeof value !== 'object' || Array.isArray(value))) return same
  const given = (value ?? {}) as Record<string, unknown>
  if (given['include_usage'] === true) return same
  const asked = encoder.encode(JSON.stringify({ ...given, include_usage: true }))
  return { ...body.spliceScanned(json, opts, asked), strip: true }
}

/** MAX_HELD: the most bytes of an unfinished event held (strip) or kept to scan (read). */
const MAX_HELD = 64 * 1024

/**
 * UsageStream reads the usage of an event stream from its body pieces, as the exchange relays them.
 * Events end at a blank line (`\n\n`, or `\n\r\n` in CRLF framing); only whole events are scanned,
 * so a piece that ends inside an event keeps that part (a copy, at most MAX_HELD) until the rest
 * arrives. An engine writes one event per chunk, so that copy is rare.
 *
 * `strip`: the usage-only event (`"choices": []` with `usage`, the chunk include_usage adds) is
 * removed from what the client receives; every other byte goes out with the piece it came in, and
 * a piece that ends inside an event goes out up to its last whole event (the rest with the next
 * piece): chunk for chunk otherwise. An unfinished event past MAX_HELD ends the stripping (the
 * stream goes on unchanged; its usage chunk, if any, then reaches the client).
 */
export class UsageStream {
  /** The last usage seen (an engine's final usage chunk comes last). */
  usage: TokenUsage | null = null
  /** The finish reasons seen, in order, when asked to collect them (`reasons`); else null. */
  readonly reasons: string[] | null
  private held: Buffer | null = null

  constructor(
    public strip: boolean,
    reasons = false,
  ) {
    this.reasons = reasons ? [] : null
  }

  /**
   * feed takes the next piece buf[start, end). Reading only, it returns null (the piece is written
   * as is). Stripping, it returns what to write instead: null for the piece unchanged, else the
   * bytes (possibly none).
   */
  feed(buf: Buffer, start: number, end: number): Uint8Array | null {
    let data = buf
    let a = start
    let b = end
    const held = this.held
    if (held !== null) {
      data = Buffer.concat([held, buf.subarray(start, end)])
      a = 0
      b = data.length
      this.held = null
    }
    const cut = lastBoundary(data, a, b)
    const whole = cut < 0 ? a : cut
    if (this.reasons !== null && whole > a) finishReasons(data, a, whole, this.reasons)
    const kept = whole > a ? this.events(data, a, whole) : null
    if (whole < b) {
      if (b - whole <= MAX_HELD) this.held = Buffer.from(data.subarray(whole, b))
      else if (this.strip) {
        // Too long to be an engine's event: stop stripping, and send everything now.
        this.strip = false
        return kept === null ? data.subarray(a, b) : Buffer.concat([kept, data.subarray(whole, b)])
      }
    }
    if (!this.strip) return null
    if (kept !== null) return kept
    return held === null && whole === b ? null : data.subarray(a, whole)
  }

  /** rest: what is still held at the end of the stream (an unfinished last event), sent as it is. */
  rest(): Uint8Array | null {
    const held = this.held
    this.held = null
    return this.strip ? held : null
  }

  /**
   * events scans the whole events in data[a, w) for usage; stripping, it returns them without the
   * usage-only one(s), or null when nothing is removed.
   */
  private events(data: Buffer, a: number, w: number): Uint8Array | null {
    let i = data.indexOf(KEY, a)
    if (i < 0 || i >= w) return null
    const parts: Uint8Array[] = []
    let from = a
    while (i >= 0 && i < w) {
      const evStart = Math.max(lastBoundary(data, a, i), a)
      const next = nextBoundary(data, i, w)
      const evEnd = next < 0 ? w : next
      const u = data[i - 1] !== BACKSLASH ? usageAt(data, i, evEnd) : null
      if (u) {
        this.usage = u
        if (this.strip && usageOnly(data, evStart, evEnd)) {
          if (evStart > from) parts.push(data.subarray(from, evStart))
          from = evEnd
        }
      }
      i = data.indexOf(KEY, evEnd)
    }
    if (from === a) return null
    if (from < w) parts.push(data.subarray(from, w))
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts)
  }
}

/** usageOnly: the event data[a, b) has `"choices": []` (the usage chunk, not a token's). */
function usageOnly(data: Buffer, a: number, b: number): boolean {
  const c = data.indexOf(CHOICES, a)
  if (c < 0 || c >= b) return false
  let k = skipSpace(data, c + CHOICES.length, b)
  if (data[k] !== COLON) return false
  k = skipSpace(data, k + 1, b)
  if (data[k] !== 0x5b) return false
  k = skipSpace(data, k + 1, b)
  return data[k] === 0x5d
}

/** lastBoundary: the index just past the last blank line (`\n\n` or `\n\r\n`) ending within data[a, b), or -1. */
function lastBoundary(data: Buffer, a: number, b: number): number {
  if (b - a < 2) return -1
  for (let k = b - 1; k > a; k--) {
    if (data[k] !== LF) continue
    const p = data[k - 1]
    if (p === LF || (p === 0x0d && k - 2 >= a && data[k - 2] === LF)) return k + 1
  }
  return -1
}

/** nextBoundary: the index just past the first blank line ending within data[from, b), or -1. */
function nextBoundary(data: Buffer, from: number, b: number): number {
  let k = data.indexOf(LF, from)
  while (k >= 0 && k < b) {
    const n = data[k + 1]
    if (k + 1 < b && n === LF) return k + 2
    if (k + 2 < b && n === 0x0d && data[k + 2] === LF) return k + 3
    k = data.indexOf(LF, k + 1)
  }
  return -1
}
