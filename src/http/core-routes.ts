import { Elysia, t } from 'elysia'
import type { Registry } from 'prom-client'
import type { AuthService } from './auth.ts'
import { authRoutes } from './auth-routes.ts'

/**
 * coreRoutes are the host's own routes on the gateway listener: health, auth (auth-routes.ts) and metrics.
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
    .use(authRoutes(o.auth))
    .get('/metrics', metricsText, {
      detail: { tags: ['metrics'], summary: 'Prometheus metrics (public)' },
    })
    .get('/api/v1/metrics', metricsText, {
      detail: { tags: ['metrics'], summary: 'Prometheus metrics (admin)' },
    })
}
