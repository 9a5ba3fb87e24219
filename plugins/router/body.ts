import type { AppError } from '../../src/http/errors.ts'
import type { BodyRange } from '../../src/wire/body-range.ts'
import { invalidJson, invalidParameter } from './errors.ts'

/**
 * readInferenceBody parses an inference request body once (native JSON parser) and returns the
 * two fields the router needs: `model`, and whether a present `max_tokens` is a positive integer.
 * The bytes themselves are forwarded unchanged. (src/wire/model-field.ts returns only the model
 * string, and parsing twice would double the hot path's cost: hence this thin adapter.)
 */
export interface InferenceFields {
  model: string
  /** the 400 to answer when max_tokens is present and not a positive integer */
  invalid: AppError | null
}

export function readInferenceBody(raw: BodyRange): InferenceFields | AppError {
  let parsed: unknown
  try {
    parsed = JSON.parse(raw.text())
  } catch {
    return invalidJson()
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
    return invalidParameter('The request body must be a JSON object')
  const body = parsed as { model?: unknown; max_tokens?: unknown }
  const model = body.model
  if (typeof model !== 'string' || model.length === 0)
    return invalidParameter("'model' is required and must be a non-empty string")
  const maxTokens = body.max_tokens
  const invalid =
    maxTokens === undefined ||
    maxTokens === null ||
    (Number.isInteger(maxTokens) && (maxTokens as number) >= 1)
      ? null
      : invalidParameter(`'max_tokens' must be a positive integer (got ${JSON.stringify(maxTokens)})`)
  return { model, invalid }
}
