import { Elysia } from 'elysia'
import type { Logger } from '../host/logger.ts'
import { type AuthService, categorize, type Principal } from './auth.ts'
import { AppError, type ErrorShape, inferenceShape, proxyError, storageFull } from './errors.ts'
import { pathOf } from './url.ts'
import { describeUnknownFields, describeValidationError, unknownFields } from './validation.ts'

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
 *
 * Then, still before validation, a body member the route does not declare is refused (400 naming
 * each one, checkBodyFields): Elysia's normalisation would drop it silently, so a misspelt option
 * would be accepted and ignored. Normalisation stays on for responses (an undeclared member of a
 * reply is left out, never an error) and for what it still does to bodies. Inference bodies stay
 * open (OpenAI clients send fields the engine knows and the gateway does not) and so do the signed
 * `/internal/*` bodies (a newer pod's extra field must not break an older one during an upgrade).
 * Because this hook reads the body, Elysia parses every route's body before the hooks run: a route
 * whose handler reads the raw bytes itself declares `parse: 'none'`.
 */
export function shapeFor(pathname: string): ErrorShape {
  return categorize(pathname) === 'inference' ? inferenceShape(pathname) : 'controller'
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

/** invalidRequest: a 400 for a request that does not fit its route, in the route's error shape. */
function invalidRequest(shape: ErrorShape, message: string): AppError {
  return shape !== 'controller'
    ? proxyError(400, 'invalid_request_error', 'invalid_request', message)
    : new AppError(400, 'VALIDATION_ERROR', message)
}

/** NO_BODY: what a route that declares no body accepts (nothing, or an empty object). */
const NO_BODY = { type: 'object', properties: {}, additionalProperties: false }

export interface BaseAppOptions {
  name: string
  auth: AuthService | null
  log: Logger
  /** shape fixes the error shape for every path (the router's listener speaks only the proxy shape). */
  shape?: ErrorShape
  /**
   * fallback: what a GET (or HEAD) that no route matched may still answer, instead of the 404 (the
   * main listener's typed dashboard addresses: dashboard/pages.ts, pageAddresses); null: the 404.
   * It runs only where no route matched, so it never shadows a route nor skips a route's guard.
   */
  fallback?: (pathname: string) => Response | null
}

export function createBaseApp(opts: BaseAppOptions) {
  const { auth, log } = opts
  // A listener whose answers are all inference-shaped still answers the Messages API in Anthropic's.
  const shapeOf = (pathname: string) =>
    opts.shape === 'proxy' ? inferenceShape(pathname) : (opts.shape ?? shapeFor(pathname))
  // Each route's body schema by `METHOD pattern`, read from the routes mounted on this app (built
  // at the first request, once every plugin's routes are in; again if routes were added since).
  let bodies = new Map<string, unknown>()
  let counted = -1
  const bodySchema = (method: string, route: string): unknown => {
    if (counted !== app.routes.length) {
      bodies = new Map(app.routes.map((r) => [`${r.method} ${r.path}`, r.hooks?.body]))
      counted = app.routes.length
    }
    return bodies.get(`${method} ${route}`) ?? bodies.get(`ALL ${route}`) ?? NO_BODY
  }
  const checkBodyFields = (method: string, route: string, body: unknown) => {
    if (body === undefined || body === null || typeof body !== 'object') return
    const category = categorize(route)
    if (category === 'inference' || category === 'internal') return
    const unknown = unknownFields(bodySchema(method, route), body)
    if (unknown.length) throw invalidRequest(shapeOf(route), describeUnknownFields(unknown))
  }
  const app = new Elysia({ name: opts.name })
    .onTransform({ as: 'global' }, async ({ request, route, body }) => {
      if (auth) {
        const principal = await auth.guard(request, route)
        if (principal) principals.set(request, principal)
      }
      checkBodyFields(request.method, route, body)
    })
    .onError({ as: 'global' }, ({ code, error, request, route }) => {
      const pathname = pathOf(request.url)
      // A matched route's errors take its pattern's shape (`/tokenize/` is still `/tokenize`).
      const shape = shapeOf(typeof route === 'string' && route !== '' ? route : pathname)
      if (code === 'VALIDATION')
        return invalidRequest(shape, describeValidationError(error)).toResponse(shape)
      if (code === 'PARSE') {
        const err =
          shape !== 'controller'
            ? proxyError(400, 'invalid_request_error', 'invalid_json', 'Request body is not valid JSON')
            : new AppError(400, 'VALIDATION_ERROR', 'Request body is not valid JSON')
        return err.toResponse(shape)
      }
      if (code === 'NOT_FOUND') {
        // HEAD reaches the app as a GET (host.ts serves it from the GET route).
        const fallback = request.method === 'GET' ? (opts.fallback?.(pathname) ?? null) : null
        if (fallback) return fallback
        const err =
          shape !== 'controller'
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
  return app
}
