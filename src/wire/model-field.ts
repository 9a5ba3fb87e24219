import { type AppError, proxyError } from '../http/errors.ts'
import { BodyRange } from './body-range.ts'

/**
 * readModelField finds the `model` of an OpenAI-style JSON request body. The body stays the bytes
 * the client sent (they are forwarded as they are); this only decodes and parses them once, with
 * the runtime's native JSON parser, reading the range in place (see BodyRange). Returns the model
 * string, or the 400 to send back.
 */
const decoder = new TextDecoder()
const encoder = new TextEncoder()

export function readModelField(body: BodyRange): string | AppError {
  let parsed: unknown
  try {
    parsed = JSON.parse(body.text())
  } catch {
    return invalidJson()
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    return proxyError(
      400,
      'invalid_request_error',
      'invalid_request',
      'The request body must be a JSON object',
    )
  }
  const model = (parsed as { model?: unknown }).model
  if (typeof model !== 'string' || model.length === 0) return missingModel()
  return model
}

export const invalidJson = () =>
  proxyError(400, 'invalid_request_error', 'invalid_json', 'Request body is not valid JSON')

export const missingModel = () =>
  proxyError(
    400,
    'invalid_request_error',
    'missing_model',
    "The request body must name a 'model' (a loaded instance id, served model name or model path)",
    'model',
  )

const QUOTE = 34
const BACKSLASH = 92
const COLON = 58

/**
 * replaceModel returns `body` with the value of its top-level `model` string replaced by `model`,
 * every other byte kept as sent. An engine only answers to its served name, so a request that
 * names the instance by id or model path is given the served name this way — a splice, not a
 * re-serialisation. The body must already have passed readModelField (valid JSON, string model);
 * with duplicate keys the last one is replaced, as JSON.parse and the engine read the last one.
 */
export function replaceModel(body: BodyRange, model: string): BodyRange {
  const bytes = body.bytes()
  const span = modelValueSpan(bytes)
  if (!span) return body
  const value = encoder.encode(JSON.stringify(model))
  const out = new Uint8Array(bytes.length - (span.end - span.start) + value.length)
  out.set(bytes.subarray(0, span.start), 0)
  out.set(value, span.start)
  out.set(bytes.subarray(span.end), span.start + value.length)
  return BodyRange.from(out)
}

/** modelValueSpan: byte range (quotes included) of the last top-level `"model": "<string>"` value. */
function modelValueSpan(b: Uint8Array): { start: number; end: number } | null {
  let depth = 0
  let found: { start: number; end: number } | null = null
  let i = 0
  const n = b.length
  while (i < n) {
    const c = b[i]!
    if (c === QUOTE) {
      const start = i
      i = stringEnd(b, i)
      if (depth !== 1) continue
      // A key at the top level is a string followed by ':'.
      let j = i
      while (j < n && isSpace(b[j]!)) j++
      if (b[j] !== COLON || !isModelKey(b, start, i)) continue
      j++
      while (j < n && isSpace(b[j]!)) j++
      if (b[j] !== QUOTE) continue
      const end = stringEnd(b, j)
      found = { start: j, end }
      i = end
      continue
    }
    if (c === 123 || c === 91) depth++
    else if (c === 125 || c === 93) depth--
    i++
  }
  return found
}

/** stringEnd: index just past the closing quote of the string starting at `i`. */
function stringEnd(b: Uint8Array, i: number): number {
  let k = i + 1
  while (k < b.length) {
    const c = b[k]!
    if (c === BACKSLASH) k += 2
    else if (c === QUOTE) return k + 1
    else k++
  }
  return k
}

function isSpace(c: number): boolean {
  return c === 32 || c === 9 || c === 10 || c === 13
}

const MODEL_KEY = encoder.encode('"model"')

function isModelKey(b: Uint8Array, start: number, end: number): boolean {
  if (end - start === MODEL_KEY.length) {
    let same = true
    for (let k = 0; k < MODEL_KEY.length; k++) {
      if (b[start + k] !== MODEL_KEY[k]) {
        same = false
        break
      }
    }
    if (same) return true
  }
  // An escaped spelling such as "mod\u0065l" is the same key.
  if (!b.subarray(start, end).includes(BACKSLASH)) return false
  try {
    return JSON.parse(decoder.decode(b.subarray(start, end))) === 'model'
  } catch {
    return false
  }
}
