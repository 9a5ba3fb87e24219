/**
 * AppError is the one place every error shape comes from.
 *
 * - controller shape: `{error: {code, message, statusCode}}` for /api/* routes;
 * - proxy shape: `{error: {message, type, param?, code}}` for inference routes (OpenAI convention);
 * - anthropic shape: `{type: "error", error: {type, message}}` for the Messages API (`/v1/messages`),
 *   the body and status codes Anthropic's clients expect (toAnthropic, anthropicStatus).
 *
 * Services throw these; the HTTP layer renders them. Anything else thrown becomes a 500 whose body
 * never carries a stack trace.
 */
export type ErrorShape = 'controller' | 'proxy' | 'anthropic'

/** MESSAGES_PATH: the Anthropic Messages API's route, whose refusals take Anthropic's shape. */
export const MESSAGES_PATH = '/v1/messages'

/** The Messages API as a cluster hop carries it to another pod (plugins/cluster/hop.ts HOP_PREFIX + the path). */
const HOPPED_MESSAGES_PATH = `/internal/v1${MESSAGES_PATH}`

/**
 * inferenceShape: the error shape of an inference route's answers: Anthropic's on MESSAGES_PATH (and
 * on its hop, whose refusals the edge pod relays to the client as they are), else OpenAI's.
 */
export function inferenceShape(path: string): 'proxy' | 'anthropic' {
  return path === MESSAGES_PATH || path === HOPPED_MESSAGES_PATH ? 'anthropic' : 'proxy'
}

export interface AnthropicErrorBody {
  type: 'error'
  error: { type: string; message: string }
}

/** The codes of an unknown model, on any listener: Anthropic answers it 404 `not_found_error`. */
const UNKNOWN_MODEL_CODES: ReadonlySet<string> = new Set(['invalid_model', 'model_not_found'])

/**
 * anthropicStatus: the status Anthropic's API gives what `error` refuses: 404 for an unknown model
 * (400 on the gateway's OpenAI routes), 529 `overloaded_error` for every 503 (a queue that is full,
 * a model asleep or loading, a server stopping: Anthropic's clients retry it, after Retry-After when
 * given), the status itself otherwise.
 */
export function anthropicStatus(error: AppError): number {
  if (UNKNOWN_MODEL_CODES.has(error.code)) return 404
  return error.status === 503 ? 529 : error.status
}

/** anthropicType: Anthropic's error `type` for an answer of `status` (its documented table). */
function anthropicType(status: number): string {
  switch (status) {
    case 401:
      return 'authentication_error'
    case 402:
      return 'billing_error'
    case 403:
      return 'permission_error'
    case 404:
      return 'not_found_error'
    case 413:
      return 'request_too_large'
    case 429:
      return 'rate_limit_error'
    case 504:
      return 'timeout_error'
    case 529:
      return 'overloaded_error'
  }
  return status >= 500 ? 'api_error' : 'invalid_request_error'
}

export interface ControllerErrorBody {
  error: { code: string; message: string; statusCode: number }
}

export interface ProxyErrorBody {
  error: { message: string; type: string; param?: string; code: string }
}

export class AppError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    /** OpenAI-style `type`, used by the proxy shape. */
    readonly type: string = defaultType(status),
    readonly param?: string,
    /** Extra response headers, e.g. Retry-After. */
    readonly headers: Record<string, string> = {},
  ) {
    super(message)
    this.name = 'AppError'
  }

  toController(): ControllerErrorBody {
    return { error: { code: this.code, message: this.message, statusCode: this.status } }
  }

  toProxy(): ProxyErrorBody {
    const error: ProxyErrorBody['error'] = { message: this.message, type: this.type, code: this.code }
    if (this.param !== undefined) error.param = this.param
    return { error }
  }

  toAnthropic(): AnthropicErrorBody {
    return { type: 'error', error: { type: anthropicType(anthropicStatus(this)), message: this.message } }
  }

  /** statusIn: the status this error is answered with in `shape` (anthropicStatus for Anthropic's). */
  statusIn(shape: ErrorShape): number {
    return shape === 'anthropic' ? anthropicStatus(this) : this.status
  }

  /** bodyIn: this error's body in `shape`. */
  bodyIn(shape: ErrorShape): ControllerErrorBody | ProxyErrorBody | AnthropicErrorBody {
    return shape === 'proxy'
      ? this.toProxy()
      : shape === 'anthropic'
        ? this.toAnthropic()
        : this.toController()
  }

  toResponse(shape: ErrorShape): Response {
    return Response.json(this.bodyIn(shape), { status: this.statusIn(shape), headers: this.headers })
  }
}

function defaultType(status: number): string {
  if (status === 401) return 'authentication_error'
  if (status === 403) return 'permission_error'
  if (status === 404) return 'not_found'
  if (status === 503) return 'service_unavailable'
  if (status >= 500) return 'server_error'
  return 'invalid_request_error'
}

// Controller-shape constructors (the codes /docs lists per route).
export const badRequest = (message: string, code = 'VALIDATION_ERROR') => new AppError(400, code, message)
export const unauthorized = (message = 'Missing or invalid authentication token') =>
  new AppError(401, 'UNAUTHORIZED', message)
export const forbidden = (role: string) =>
  new AppError(403, 'FORBIDDEN', `This action requires the '${role}' role`)
export const notFound = (message: string, code = 'NOT_FOUND') => new AppError(404, code, message)
export const conflict = (message: string, code = 'CONFLICT') => new AppError(409, code, message)
export const modelNotFound = (id: string) => new AppError(404, 'MODEL_NOT_FOUND', `No model with id '${id}'`)
export const insufficientMemory = (message: string) => new AppError(400, 'INSUFFICIENT_MEMORY', message)
export const internalError = (message = 'Internal server error') =>
  new AppError(500, 'INTERNAL_ERROR', message, 'server_error')

// Proxy-shape constructors.
export const proxyError = (
  status: number,
  type: string,
  code: string,
  message: string,
  param?: string,
  headers: Record<string, string> = {},
) => new AppError(status, code, message, type, param, headers)

/** The codes of a write refused for lack of space: the file system's (disk, quota) and SQLite's. */
const STORAGE_FULL_CODES = new Set(['ENOSPC', 'EDQUOT', 'SQLITE_FULL'])

/**
 * storageFull: 507 INSUFFICIENT_STORAGE when `err` (or an error it wraps as its `cause`, as drizzle
 * wraps SQLite's) is a write refused because the disk is full, else null. `what` says what could not be
 * written. A full disk is the operator's to fix, not a bug: the answer says so instead of a bare 500.
 */
export function storageFull(err: unknown, what = 'modelgate could not write its data'): AppError | null {
  let e: unknown = err
  for (let depth = 0; e && typeof e === 'object' && depth < 8; depth++) {
    const code = (e as { code?: unknown }).code
    if (typeof code === 'string' && STORAGE_FULL_CODES.has(code))
      return new AppError(
        507,
        'INSUFFICIENT_STORAGE',
        `The disk is full (${code}): ${what}. Free space on the file system of modelgate's data dir and retry.`,
      )
    e = (e as { cause?: unknown }).cause
  }
  return null
}

/** toAppError turns anything thrown into an AppError without leaking internals. */
export function toAppError(err: unknown): AppError {
  if (err instanceof AppError) return err
  return storageFull(err) ?? internalError()
}
