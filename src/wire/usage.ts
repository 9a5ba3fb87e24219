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
 * The Responses API (`/v1/responses`) and Anthropic's Messages API (`/v1/messages`) name the counts
 * `input_tokens` and `output_tokens`, and always stream them: Responses in its `response.completed`
 * event, Messages in `message_start` (the input, and the output so far) and `message_delta` (the
 * output, cumulative; the input too in newer builds). A usage object without an input count takes
 * the one seen before it in the stream. Neither API is asked for anything (askForUsage is for the
 * chat and completion routes' stream_options), and nothing of their streams is stripped.
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
 * is not followed by an object with a count (e.g. `"usage": null` in a chunk). Its `prompt` is -1
 * when it has an output count only (a Messages stream's `message_delta`).
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
/** The same counts in the Responses and Messages APIs. */
const INPUT = 'input_tokens'
const OUTPUT = 'output_tokens'

/**
 * countsOf: the counts of the usage object opening at buf[a] (within [a, b)), read in place in one
 * pass (the request path parses no JSON for it): its own `prompt_tokens` (or `input_tokens`) and
 * `completion_tokens` (or `output_tokens`) when they are non-negative integers (nested objects, such
 * as the details, are skipped); null when the object does not close or has neither count; `prompt`
 * -1 when it has the output count only.
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
        const which = countKey(buf, k + 1, close)
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
        if (--depth === 0)
          return prompt < 0 && completion < 0 ? null : { prompt, completion: Math.max(0, completion) }
      }
      k++
    }
  }
  return null
}

/** countKey: which count the key buf[a, b) names: 1 the prompt's, 2 the completion's, 0 neither. */
function countKey(buf: Uint8Array, a: number, b: number): 0 | 1 | 2 {
  if (keyIs(buf, a, b, PROMPT) || keyIs(buf, a, b, INPUT)) return 1
  if (keyIs(buf, a, b, COMPLETION) || keyIs(buf, a, b, OUTPUT)) return 2
  return 0
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
      if (u && u.prompt >= 0) return u
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

/**
 * USAGE_STREAMS: the routes whose streams carry usage only when asked (`stream_options.include_usage`,
 * askForUsage): OpenAI's chat and completion routes, on the engine as on every listener. The
 * Responses and Messages APIs always stream theirs.
 */
export const USAGE_STREAMS: ReadonlySet<string> = new Set(['/v1/chat/completions', '/v1/completions'])

const TRUE = Buffer.from('true')
const encoder = new TextEncoder()
const INSERTED = encoder.encode(',"stream_options":{"include_usage":true}')
/** Where the inserted stream_options value starts (after `,"stream_options":`). */
const INSERTED_VALUE = INSERTED.indexOf(0x7b)
/** The longest `stream` value read as a lax boolean (`"true"`, `1.0`): anything longer is none. */
const MAX_FLAG_BYTES = 16
/** The strings pydantic's lax mode reads as true, in lower case (it compares them case-insensitively). */
const LAX_TRUE_STRINGS: ReadonlySet<string> = new Set(['1', 'on', 't', 'true', 'y', 'yes'])

/**
 * laxTrue: whether an engine reads `value` as true. vLLM's and SGLang's request models are pydantic
 * models in lax mode, which take `true`, the number 1 (`1.0` too) and the strings `1`, `on`, `t`,
 * `true`, `y`, `yes` in any case as true (and their opposites as false): `"stream": 1` and
 * `"stream": "TRUE"` stream as `"stream": true` does, so they must be read as the engine reads them.
 */
export function laxTrue(value: unknown): boolean {
  if (value === true || value === 1) return true
  return typeof value === 'string' && LAX_TRUE_STRINGS.has(value.toLowerCase())
}

/** streams: the request's `stream` is one the engine reads as true (laxTrue), read from its scan. */
export function streams(json: ScannedJson): boolean {
  const stream = json.span('stream')
  if (!stream) return false
  if (json.bytesAre(stream, TRUE)) return true
  if (stream[1] - stream[0] > MAX_FLAG_BYTES) return false
  try {
    return laxTrue(json.value('stream'))
  } catch {
    return false
  }
}

/**
 * askForUsage: a streamed request (`stream` true as the engine reads it: laxTrue) made to ask the
 * engine for the usage chunk, if it does not already: `stream_options.include_usage` set to true by
 * a splice (inserted after `stream`'s value, or the existing `stream_options` object rewritten with
 * it), every other byte as the client sent it. `strip`: the client did not ask, so the chunk must not
 * reach it. A request that is not streamed, or whose `stream_options` is not an object (the engine
 * will refuse it), is left as it is.
 */
export function askForUsage(
  body: BodyRange,
  json: ScannedJson,
): { body: BodyRange; json: ScannedJson; strip: boolean } {
  const same = { body, json, strip: false }
  if (!streams(json)) return same
  const stream = json.span('stream')!
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
  if (laxTrue(given['include_usage'])) return same
  const asked = encoder.encode(JSON.stringify({ ...given, include_usage: true }))
  return { ...body.spliceScanned(json, opts, asked), strip: true }
}

/**
 * BYTES_PER_PROMPT_TOKEN: a request's prompt tokens, estimated from its body before the engine
 * counts them: one token per 4 bytes of the body as sent, JSON syntax included (English text runs
 * about 4 characters a token). Used only until the engine's own count arrives, which replaces it.
 */
export const BYTES_PER_PROMPT_TOKEN = 4

/** promptEstimate: the prompt tokens of a body of `bytes` bytes (BYTES_PER_PROMPT_TOKEN). */
export function promptEstimate(bytes: number): number {
  return Math.ceil(bytes / BYTES_PER_PROMPT_TOKEN)
}

/** DEFAULT_CONTEXT_TOKENS: a request's completion worst case without max_tokens when the engine's context is not known. */
export const DEFAULT_CONTEXT_TOKENS = 32_768
/** The most choices (`n`) a worst case counts: past it the engine's own limits refuse the request. */
const MAX_CHOICES = 128

/**
 * requestCost: the most tokens a request may use, which an inference key reserves while it runs
 * (key.ts): its prompt's estimate (promptEstimate) and, for each of its `n` choices, its completion
 * limit: `max_completion_tokens` or `max_tokens` (the larger when both are sent), or the engine's
 * context when neither is (`context`, else DEFAULT_CONTEXT_TOKENS), never more than the context; the
 * Responses API's limit is `max_output_tokens` (the Messages API's is `max_tokens`). A
 * number sent as a string counts as the engines' lax parsing reads it. Reads only the scan's
 * recorded fields; a body that is no JSON object costs its prompt's estimate alone.
 */
export function requestCost(bytes: number, json: ScannedJson | null, context: number | null): number {
  const prompt = promptEstimate(bytes)
  if (json === null) return prompt
  const ctx = context !== null && context > 0 ? context : DEFAULT_CONTEXT_TOKENS
  const limit = Math.max(
    count(json, 'max_tokens'),
    count(json, 'max_completion_tokens'),
    count(json, 'max_output_tokens'),
  )
  const completion = limit > 0 ? Math.min(limit, ctx) : ctx
  const n = Math.min(MAX_CHOICES, Math.max(1, count(json, 'n')))
  return prompt + n * completion
}

/** count: a recorded field as a non-negative whole number (a numeric string too), 0 when absent or none. */
function count(
  json: ScannedJson,
  key: 'max_tokens' | 'max_completion_tokens' | 'max_output_tokens' | 'n',
): number {
  const span = json.span(key)
  if (!span || span[1] - span[0] > MAX_FLAG_BYTES + 8) return 0
  let v: unknown
  try {
    v = json.value(key)
  } catch {
    return 0
  }
  const n = typeof v === 'string' ? Number(v) : v
  return typeof n === 'number' && Number.isFinite(n) && n > 0 ? Math.ceil(n) : 0
}

/**
 * charged: what a request that ended is charged: the engine's own count when it arrived, else, for
 * a stream that ended before it (the client left, the engine died), its output events that reached
 * the client (ForwardEnd.chunks, one completion token each) and its prompt's estimate; null when
 * nothing reached the client.
 */
export function charged(info: { usage?: TokenUsage; chunks?: number }, bodyBytes: number): TokenUsage | null {
  if (info.usage) return info.usage
  const chunks = info.chunks ?? 0
  return chunks > 0 ? { prompt: promptEstimate(bodyBytes), completion: chunks } : null
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
  /**
   * chunks: the events of the stream that carried a choice's output (a `data:` line holding a JSON
   * object, not the usage-only chunk): what the client was sent, counted as it passed. vLLM and
   * SGLang write one such event per choice per decode step, each one token or more (several with
   * speculative decoding; the first may carry only the role), so it is the completion tokens of a
   * stream that ended before its usage chunk, within a chunk's tokens of the engine's count.
   */
  chunks = 0
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
    if (whole > a) this.count(data, a, whole)
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

  /** count: the output events among the whole events data[a, w) (see chunks). */
  private count(data: Buffer, a: number, w: number): void {
    let k = a
    while (k < w) {
      const next = nextBoundary(data, k, w)
      const end = next < 0 ? w : next
      if (jsonData(data, k, end)) this.chunks++
      k = end
    }
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
      // An output count alone (message_delta) keeps the input count seen before it.
      if (u && u.prompt < 0) {
        if (this.usage) this.usage = { prompt: this.usage.prompt, completion: u.completion }
      } else if (u) {
        this.usage = u
        const only = usageOnly(data, evStart, evEnd)
        // The usage chunk is no output (count counted it as an event with a JSON object).
        if (only) this.chunks--
        if (this.strip && only) {
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

/** jsonData: the event data[a, b) has a line `data:` (one optional space) whose value opens a JSON object. */
function jsonData(data: Buffer, a: number, b: number): boolean {
  let i = a
  while (i + 5 < b) {
    if (
      data[i] === 0x64 &&
      data[i + 1] === 0x61 &&
      data[i + 2] === 0x74 &&
      data[i + 3] === 0x61 &&
      data[i + 4] === COLON
    ) {
      const v = data[i + 5] === 0x20 ? i + 6 : i + 5
      return data[v] === OPEN
    }
    const lf = data.indexOf(LF, i)
    if (lf < 0 || lf >= b) return false
    i = lf + 1
  }
  return false
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
