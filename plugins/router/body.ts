import type { AppError } from '../../src/http/errors.ts'
import type { ScanFailure, ScannedJson } from '../../src/wire/json-scan.ts'
import { invalidJson, invalidParameter } from './errors.ts'

/**
 * readInferenceBody reads the two fields the router needs from an inference body's scan (the
 * listener validated it as JSON within its depth limit and located its top-level fields in place,
 * src/wire/json-scan.ts; nothing else of the body is parsed): `model`, and whether a present
 * `max_tokens` is a positive integer. The bytes themselves are forwarded unchanged.
 */
export interface InferenceFields {
  model: string
  /** the body's scan, for the forward */
  json: ScannedJson
  /** the 400 to answer when max_tokens is present and not a positive integer */
  invalid: AppError | null
}

export function readInferenceBody(json: ScannedJson | ScanFailure): InferenceFields | AppError {
  if (json === 'invalid') return invalidJson()
  if (json === 'too_deep') return invalidParameter('The request body is nested too deeply')
  if (json === 'not_object') return invalidParameter('The request body must be a JSON object')
  const model = json.string('model')
  if (model === undefined || model.length === 0)
    return invalidParameter("'model' is required and must be a non-empty string")
  const maxTokens = json.value('max_tokens')
  const invalid =
    maxTokens === undefined ||
    maxTokens === null ||
    (Number.isInteger(maxTokens) && (maxTokens as number) >= 1)
      ? null
      : invalidParameter(`'max_tokens' must be a positive integer (got ${JSON.stringify(maxTokens)})`)
  return { model, invalid, json }
}
