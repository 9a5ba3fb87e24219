/**
 * What a traced request's span learns from the engine's answer without the proxy parsing it: the
 * token counts of its `usage` object and the `finish_reason` of each choice, read from the bytes the
 * exchange relays anyway (a held JSON body whole; of a stream, its last TAIL_BYTES, where vLLM puts
 * the last choice chunks and, with `stream_options.include_usage`, the usage chunk). Only the few
 * bytes around those keys are read: a long answer or an embeddings body is searched natively
 * (indexOf), never decoded or parsed whole.
 *
 * A generated text cannot pass for one of these keys: inside a JSON string a quote is escaped, so
 * `"usage"` with both quotes bare only occurs as a key.
 */
export interface ResponseUsage {
  inputTokens?: number
  outputTokens?: number
  finishReasons?: string[]
}

/** TAIL_BYTES: how much of a stream's end is kept (the usage chunk and the last choice chunks fit many times). */
export const TAIL_BYTES = 4096
/** USAGE_BYTES: the most of a usage object read (vLLM's is about 100 bytes, with its details objects a few hundred). */
const USAGE_BYTES = 2048

const USAGE_KEY = Buffer.from('"usage"', 'latin1')
const FINISH_KEY = Buffer.from('"finish_reason"', 'latin1')
const PROMPT_KEY = Buffer.from('"prompt_tokens"', 'latin1')
const COMPLETION_KEY = Buffer.from('"completion_tokens"', 'latin1')
/** The usual reasons, as shared strings (no string made per answer for them). */
const REASONS = ['stop', 'length', 'abort', 'tool_calls', 'content_filter'].map((r) => ({
  text: r,
  bytes: Buffer.from(r, 'latin1'),
}))
const QUOTE = 0x22
const BACKSLASH = 0x5c
const OPEN = 0x7b
const CLOSE = 0x7d
const COLON = 0x3a

/**
 * ResponseTail keeps the last TAIL_BYTES of a streamed body in a ring copied into (the stream's
 * own buffers are not held), allocated at the first byte kept.
 */
export class ResponseTail {
  private ring: Buffer | null = null
  private pos = 0
  private wrapped = false

  keep(buf: Buffer, start: number, end: number): void {
    this.ring ??= Buffer.allocUnsafe(TAIL_BYTES)
    const ring = this.ring
    if (end - start >= TAIL_BYTES) {
      buf.copy(ring, 0, end - TAIL_BYTES, end)
      this.pos = 0
      this.wrapped = true
      return
    }
    const first = Math.min(end - start, TAIL_BYTES - this.pos)
    buf.copy(ring, this.pos, start, start + first)
    if (start + first < end) {
      buf.copy(ring, 0, start + first, end)
      this.pos = end - start - first
      this.wrapped = true
    } else {
      this.pos += first
      if (this.pos === TAIL_BYTES) {
        this.pos = 0
        this.wrapped = true
      }
    }
  }

  /** bytes: what was kept, oldest first. */
  bytes(): Uint8Array {
    const ring = this.ring
    if (ring === null) return new Uint8Array(0)
    if (!this.wrapped) return ring.subarray(0, this.pos)
    return Buffer.concat([ring.subarray(this.pos), ring.subarray(0, this.pos)])
  }
}

/** readUsage: the counts and finish reasons found in `body` (a JSON answer, or a stream's tail); null: none. */
export function readUsage(body: Uint8Array): ResponseUsage | null {
  const buf = Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength)
  const out: ResponseUsage = {}
  const usage = lastUsageObject(buf)
  if (usage !== null) {
    const prompt = countAfter(buf, PROMPT_KEY, usage[0], usage[1])
    const completion = countAfter(buf, COMPLETION_KEY, usage[0], usage[1])
    if (prompt >= 0) out.inputTokens = prompt
    if (completion >= 0) out.outputTokens = completion
  }
  const reasons = finishReasons(buf)
  if (reasons.length > 0) out.finishReasons = reasons
  return out.inputTokens === undefined && out.outputTokens === undefined && !out.finishReasons ? null : out
}

/** countAfter: the non-negative integer value of `key` inside [from, to), or -1. */
function countAfter(buf: Buffer, key: Buffer, from: number, to: number): number {
  const at = buf.indexOf(key, from)
  if (at < 0 || at >= to) return -1
  let i = afterColon(buf, at + key.length)
  if (i < 0) return -1
  let n = -1
  for (; i < to; i++) {
    const d = buf[i]! - 48
    if (d < 0 || d > 9) break
    n = n < 0 ? d : n * 10 + d
  }
  return n
}

/**
 * lastUsageObject: [start, end) of the last `"usage": {…}` object in buf (a stream's chunks before
 * the last may carry `"usage": null`, or their own running counts), or null.
 */
function lastUsageObject(buf: Buffer): [number, number] | null {
  let at = buf.length
  for (;;) {
    at = buf.lastIndexOf(USAGE_KEY, at - 1)
    if (at < 0) return null
    const open = afterColon(buf, at + USAGE_KEY.length)
    if (open >= 0 && buf[open] === OPEN) {
      const close = objectEnd(buf, open, Math.min(buf.length, open + USAGE_BYTES))
      if (close > 0) return [open, close]
    }
    if (at === 0) return null
  }
}

/** finishReasons: every `"finish_reason": "<reason>"` in buf, in order (null ones left out). */
function finishReasons(buf: Buffer): string[] {
  const out: string[] = []
  let at = buf.indexOf(FINISH_KEY)
  while (at >= 0) {
    const value = afterColon(buf, at + FINISH_KEY.length)
    if (value >= 0 && buf[value] === QUOTE) {
      const end = buf.indexOf(QUOTE, value + 1)
      // A reason is a short plain word (stop, length, abort, tool_calls...).
      if (end > value && end - value <= 64 && buf[end - 1] !== BACKSLASH)
        out.push(reasonAt(buf, value + 1, end))
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

/** afterColon: the index of the value after a key ending at i (`: ` with any JSON whitespace), or -1. */
function afterColon(buf: Buffer, i: number): number {
  while (i < buf.length && isSpace(buf[i]!)) i++
  if (buf[i] !== COLON) return -1
  i++
  while (i < buf.length && isSpace(buf[i]!)) i++
  return i < buf.length ? i : -1
}

function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09
}

/** objectEnd: the index after the `}` closing the object opened at `open`, strings skipped; -1 if not before `limit`. */
function objectEnd(buf: Buffer, open: number, limit: number): number {
  let depth = 0
  for (let i = open; i < limit; i++) {
    const c = buf[i]
    if (c === QUOTE) {
      for (i++; i < limit && buf[i] !== QUOTE; i++) if (buf[i] === BACKSLASH) i++
    } else if (c === OPEN) depth++
    else if (c === CLOSE && --depth === 0) return i + 1
  }
  return -1
}
