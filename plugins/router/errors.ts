import { type AppError, proxyError } from '../../src/http/errors.ts'

/**
 * Router errors, all in one error shape `{error: {message, type, code}}` (the proxy
 * shape of src/http/errors.ts). The router listener renders every error this way, including on
 * its admin routes, so a client needs a single parser.
 */
export const modelNotFound = (model: string): AppError =>
  proxyError(404, 'not_found', 'model_not_found', `Model '${model}' is not configured`)

export const invalidParameter = (message: string): AppError =>
  proxyError(400, 'invalid_request', 'invalid_parameter', message)

export const invalidJson = (): AppError =>
  proxyError(400, 'invalid_request', 'invalid_json', 'Request body is not valid JSON')

/** modelWaking: 503 with Retry-After, the answer while a model wakes up. */
export const modelWaking = (model: string, retryAfterSeconds: number, message?: string): AppError =>
  proxyError(
    503,
    'service_unavailable',
    'model_waking',
    message ?? `Model '${model}' is waking up; retry in ${retryAfterSeconds} s`,
    undefined,
    { 'retry-after': String(retryAfterSeconds) },
  )

/** wakeFailed: the engine did not answer the wake a request started. */
export const wakeFailed = (model: string, reason: string): AppError =>
  proxyError(502, 'bad_gateway', 'wake_failed', `Model '${model}' could not be woken up: ${reason}`)

export const routeNotFound = (method: string, path: string): AppError =>
  proxyError(404, 'not_found', 'not_found', `No route for ${method} ${path}`)

export const internalError = (): AppError =>
  proxyError(500, 'server_error', 'internal_error', 'Internal server error')

/** ActionRefused: the model's state does not allow the action (rendered as a 409 error result). */
export class ActionRefused extends Error {
  constructor(
    message: string,
    readonly extra: Record<string, number> = {},
  ) {
    super(message)
    this.name = 'ActionRefused'
  }
}
