import { Elysia } from 'elysia'
import type { Logger } from '../host/logger.ts'
import { type AuthService, categorize, type Principal } from './auth.ts'
import { AppError, type ErrorShape, proxyError, storageFull } from './errors.ts'
import { pathOf } from './url.ts'
import { describeValidationError } from './validation.ts'

/**
 * createBaseApp builds the Elysia instance every listener starts from: the one auth guard, and the
 * one error renderer (controller shape for /api/*, proxy shape for inference paths). Elysia's own
 * validation, parse and not-found errors come out in those shapes too, never as its raw dump or a
 * stack trace.
 *
 * The guard runs as a transform hook, once the router has matched a route and before validation
 * and the handler: it authorises the matched route's pattern (`route`), so a path the router does
 * not match never reaches a handler (404), and one it matches is judged by that route's own
 * declaration. A body is parsed before the guard runs (Elysia parses before transforms); the
 * listener's front bounds its size and nesting before it gets here.
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
  const full = storageFull(err)
  log.error(full ? 'write failed: the disk is full' : 'unhandled error', {
    path: pathname,
    error: err instanceof Error ? (err.stack ?? err.message) : String(err),
  })
  if (full) return full.toResponse(shape)
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
    .onTransform({ as: 'global' }, async ({ request, route }) => {
      if (!auth) return
      const principal = await auth.guard(request, route)
      if (principal) principals.set(request, principal)
    })
    .onError({ as: 'global' }, ({ code, error, request, route }) => {
      const pathname = pathOf(request.url)
      // A matched route's errors take its pattern's shape (`/tokenize/` is still `/tokenize`).
      const shape = shapeOf(typeof route === 'string' && route !== '' ? route : pathname)
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
      return renderError(error, pathname, log, shape)
    })
}
