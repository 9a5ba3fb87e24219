import { type AppError, proxyError } from '../http/errors.ts'
import type { BodyRange } from './body-range.ts'
import type { ScanFailure, ScannedJson } from './json-scan.ts'

/**
 * modelOf reads the `model` of an OpenAI-style JSON request body from its scan (json-scan.ts: the
 * body validated and its top-level fields located in place, never parsed whole). The body stays
 * the bytes the client sent, which are forwarded as they are. Returns the model string, or the 400
 * to send back.
 */
export function modelOf(json: ScannedJson): string | AppError {
  const model = json.string('model')
  if (model === undefined || model.length === 0) return missingModel()
  return model
}

/** scanRefusal: the 400 for a body that did not scan as a JSON object. */
export function scanRefusal(failure: ScanFailure, maxDepth: number): AppError {
  if (failure === 'invalid') return invalidJson()
  if (failure === 'too_deep') return tooDeep(maxDepth)
  return proxyError(400, 'invalid_request_error', 'invalid_request', 'The request body must be a JSON object')
}

/** DEFAULT_JSON_DEPTH: server.max_json_depth's default, for callers outside a listener (tests, tools). */
export const DEFAULT_JSON_DEPTH = 64

/** readModelField: modelOf a body scanned here. */
export function readModelField(body: BodyRange, maxDepth = DEFAULT_JSON_DEPTH): string | AppError {
  const json = body.scanJson(maxDepth)
  return typeof json === 'string' ? scanRefusal(json, maxDepth) : modelOf(json)
}

export const invalidJson = () =>
  proxyError(400, 'invalid_request_error', 'invalid_json', 'Request body is not valid JSON')

export const tooDeep = (maxDepth: number) =>
  proxyError(400, 'invalid_request_error', 'invalid_json', `JSON body nested deeper than ${maxDepth}`)

export const missingModel = () =>
  proxyError(
    400,
    'invalid_request_error',
    'missing_model',
    "The request body must name a 'model' (a loaded instance id, served model name or model path)",
    'model',
  )

const encoder = new TextEncoder()

/**
 * replaceModel returns `body` with the value of its top-level `model` string replaced by `model`,
 * every other byte kept as sent. An engine only answers to its served name, so a request that
 * names the instance by id or model path is given the served name this way: a splice, not a
 * re-serialisation. `json` is the body's scan (taken here when not given); with duplicate keys the
 * last one is replaced, as JSON.parse and the engine read the last one.
 */
export function replaceModel(
  body: BodyRange,
  model: string,
  json: ScannedJson | ScanFailure = body.scanJson(DEFAULT_JSON_DEPTH),
): BodyRange {
  const span = typeof json === 'string' ? null : json.span('model')
  if (!span) return body
  return body.splice(span, encoder.encode(JSON.stringify(model)))
}
