import { Elysia, t } from 'elysia'
import type { Registry } from 'prom-client'
import { PEER_HEADER } from '../wire/headers.ts'
import { principalOf } from './app.ts'
import type { AuthService } from './auth.ts'
import { unauthorized } from './errors.ts'
import { ControllerError } from './schemas.ts'

/**
 * coreRoutes are the host's own routes on the gateway listener: health, auth and metrics.
 */
export interface CoreRoutesOptions {
  auth: AuthService
  metrics: Registry
  version: string
  startedAt: number
  /** ready tells whether every plugin has started. */
  ready: () => boolean
  plugins: () => string[]
}

const Timestamped = (status: string) =>
  t.Object({ status: t.Literal(status), timestamp: t.String({ format: 'date-time' }) })

const UserInfo = t.Object({
  sub: t.String(),
  username: t.String(),
  roles: t.Array(t.String()),
  authMode: t.String(),
  exp: t.Optional(t.Number()),
})

export function coreRoutes(o: CoreRoutesOptions) {
  const metricsText = async () =>
    new Response(await o.metrics.metrics(), { headers: { 'content-type': o.metrics.contentType } })
  return new Elysia({ name: 'core' })
    .group('/api/health', (g) =>
      g
        .get(
          '',
          () => ({
            status: 'ok' as const,
            version: o.version,
            uptime_seconds: Math.round((Date.now() - o.startedAt) / 1000),
            timestamp: new Date().toISOString(),
            plugins: o.plugins(),
          }),
          {
            detail: {
              tags: ['health'],
              summary: 'Service health',
              description: 'Always 200 while the process serves.',
            },
            response: t.Object({
              status: t.Literal('ok'),
              version: t.String(),
              uptime_seconds: t.Number(),
              timestamp: t.String(),
              plugins: t.Array(t.String()),
            }),
          },
        )
        .get(
          '/ready',
          ({ set }) => {
            if (!o.ready()) {
              set.status = 503
              return { status: 'starting', timestamp: new Date().toISOString() }
            }
            return { status: 'ready', timestamp: new Date().toISOString() }
          },
          {
            detail: {
              tags: ['health'],
              summary: 'Readiness',
              description: '200 once every plugin has started; 503 `{status: "starting"}` before that.',
            },
            response: { 200: Timestamped('ready'), 503: Timestamped('starting') },
          },
        )
        .get('/live', () => ({ status: 'alive' as const, timestamp: new Date().toISOString() }), {
          detail: { tags: ['health'], summary: 'Liveness' },
          response: Timestamped('alive'),
        }),
    )
    .group('/api/auth', (g) =>
      g
        .get('/info', () => o.auth.info(), {
          detail: { tags: ['auth'], summary: 'Auth mode and how to log in' },
          response: t.Object({
            mode: t.String(),
            auth_enabled: t.Boolean(),
            login_url: t.Nullable(t.String()),
            login_method: t.Nullable(t.String()),
            inference_api_key_required: t.Boolean(),
            token_lifetime_seconds: t.Nullable(t.Number()),
            roles: t.Array(t.String()),
          }),
        })
        .post(
          '/login',
          ({ body, request }) =>
            o.auth.login(body.username, body.password, request.headers.get(PEER_HEADER) ?? 'unknown'),
          {
            body: t.Object({ username: t.String({ minLength: 1 }), password: t.String({ minLength: 1 }) }),
            detail: {
              tags: ['auth'],
              summary: 'Simple-mode login',
              description:
                'Returns an HS256 JWT (claims sub, username, roles, authMode, iat, exp, jti). Each client ' +
                'address may try `server.login_attempts_per_minute` times a minute; beyond, 429 with Retry-After.',
            },
            response: {
              200: t.Object({
                token: t.String(),
                token_type: t.Literal('Bearer'),
                expires_at: t.String(),
                expires_in: t.Number(),
                user: t.Object({ username: t.String(), roles: t.Array(t.String()) }),
              }),
              400: ControllerError,
              401: ControllerError,
              429: ControllerError,
            },
          },
        )
        .get(
          '/me',
          async ({ request }) => {
            if (o.auth.mode === 'none')
              return { sub: 'anonymous', username: 'anonymous', roles: ['admin'], authMode: 'none' }
            return principalOf(request) ?? (await o.auth.adminPrincipal(request, '/api/auth/me'))
          },
          {
            detail: {
              tags: ['auth'],
              summary: 'Current user',
              description: 'With AUTH_MODE=none everyone is an anonymous admin.',
              security: [{ adminJwt: [] }],
            },
            response: { 200: UserInfo, 401: ControllerError },
          },
        )
        .post(
          '/logout',
          async ({ request }) => {
            if (o.auth.mode !== 'none') {
              const principal = await o.auth.adminPrincipal(request, '/api/auth/logout').catch(() => {
                throw unauthorized()
              })
              o.auth.revoke(principal)
            }
            return { success: true, message: 'Logged out; the token is revoked until it expires' }
          },
          {
            detail: {
              tags: ['auth'],
              summary: 'Log out',
              description:
                'Revokes the presented token (in memory, until its exp) and tells the client to discard it.',
              security: [{ adminJwt: [] }],
            },
            response: { 200: t.Object({ success: t.Boolean(), message: t.String() }), 401: ControllerError },
          },
        ),
    )
    .get('/metrics', metricsText, {
      detail: { tags: ['metrics'], summary: 'Prometheus metrics (public)' },
    })
    .get('/api/v1/metrics', metricsText, {
      detail: { tags: ['metrics'], summary: 'Prometheus metrics (admin)' },
    })
}
