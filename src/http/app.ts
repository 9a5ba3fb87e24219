import { Elysia } from 'elysia'
import type { Logger } from '../host/logger.ts'
import { type AuthService, categorize, type Principal } from './auth.ts'
import { AppError, type ErrorShape, proxyError } from './errors.ts'
import { pathOf } from './url.ts'
import { describeValidationError } from './validation.ts'

/**
 * createBaseApp builds the Elysia instance every listener starts from: the one auth guard, and the
 * one error renderer (controller shape for /api/*, proxy shape for inference paths). Elysia's own
 * validation, parse and not-found errors come out in those shapes too, never as its raw dump or a
 * stack trace.
 */
export function shapeFor(pathname: string): ErrorShape {
  return categorize(pathname) === 'inference' ? 'proxy' : 'controller'
}

const principals = new WeakMap<Request, Principal>()

/** principalOf returns who made an admin request (set by the guard). */
export function principalOf(req: Request): Principal | undefined {
  return principals.get(req)
}

export function renderError(err: unknown, pathname: string, log: Logger, fixed?: ErrorShape): Response {
  const shape = fixed ?? shapeFor(pathname)
  if (err instanceof AppError) return err.toResponse(shape)
  log.error('unhandled error', {
    path: pathname,
    error: err instanceof Error ? (err.stack ?? err.message) : String(err),
  })
  return new AppError(500, 'INTERNAL_ERROR', 'Internal server error', 'server_error').toResponse(shape)
}

export interface BaseAppOptions {
  name: string
  auth: AuthService | null
  log: Logger
  /** shape fixes the error shape for every path (the router's listener speaks only the proxy shape). */
  shape?: ErrorShape
}

export function createBaseApp(opts: BaseAppOptions) {
  const { auth, log } = opts
  const shapeOf = (pathname: string) => opts.shape ?? shapeFor(pathname)
  return new Elysia({ name: opts.name })
    .onRequest(async ({ request }) => {
      if (!auth) return
      const url = new URL(request.url)
      try {
        const principal = await auth.guard(request, url)
        if (principal) principals.set(request, principal)
      } catch (err) {
        return renderError(err, url.pathname, log, opts.shape)
      }
    })
    .onError({ as: 'global' }, ({ code, error, request }) => {
      const pathname = pathOf(request.url)
      const shape = shapeOf(pathname)
      if (code === 'VALIDATION') {
        const message = describeValidationError(error)
        const err =
          shape === 'proxy'
            ? proxyError(400, 'invalid_request_error', 'invalid_request', message)
            : new AppError(400, 'VALIDATION_ERROR', message)
        return err.toResponse(shape)
      }
      if (code === 'PARSE') {
        const err =
          shape === 'proxy'
            ? proxyError(400, 'invalid_request_error', 'invalid_json', 'Request body is not valid JSON')
            : new AppError(400, 'VALIDATION_ERROR', 'Request body is not valid JSON')
        return err.toResponse(shape)
      }
      if (code === 'NOT_FOUND') {
        const err =
          shape === 'proxy'
            ? proxyError(
                404,
                'invalid_request_error',
                'not_found',
                `No route for ${request.method} ${pathname}`,
              )
            : new AppError(404, 'NOT_FOUND', `No route for ${request.method} ${pathname}`)
        return err.toResponse(shape)
      }
      return renderError(error, pathname, log, opts.shape)
    })
}
