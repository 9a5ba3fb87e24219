/**
 * AppError is the one place both error shapes come from.
 *
 * - controller shape: `{error: {code, message, statusCode}}` for /api/* routes;
 * - proxy shape: `{error: {message, type, param?, code}}` for inference routes (OpenAI convention).
 *
 * Services throw these; the HTTP layer renders them. Anything else thrown becomes a 500 whose body
 * never carries a stack trace.
 */
export type ErrorShape = 'controller' | 'proxy'

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

  toResponse(shape: ErrorShape): Response {
    const body = shape === 'proxy' ? this.toProxy() : this.toController()
    return Response.json(body, { status: this.status, headers: this.headers })
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
