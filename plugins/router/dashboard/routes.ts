import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import { ActionResultSchema, RouterOverviewSchema } from '../schemas.ts'
import type { RouterService } from '../service.ts'

/**
 * routerDashboardRoutes: what the dashboard's Router page reads and does, on the MAIN listener (the
 * page's Content-Security-Policy lets it talk to its own origin only, and the router's own port has
 * no admin login): the router's models, traffic, sleep states and candidates in one read, and sleep
 * and wake. Behind the admin JWT like every /api route (reads: both roles; actions: admin). The
 * actions are the router's own (`/action/sleep|wakeup/{model}`, same answers); an admin needs no
 * inference key for them.
 */
const tags = ['dashboard']
const Name = t.Object({ name: t.String({ maxLength: 512 }) })
const actionErrors = { 401: ControllerError, 403: ControllerError, 404: ControllerError }

export function routerDashboardRoutes(service: RouterService, inferenceKey: () => string | undefined) {
  const bearer = () => {
    const key = inferenceKey()
    return key ? `Bearer ${key}` : null
  }
  return new Elysia({ name: 'router-dashboard-routes' })
    .get('/api/dashboard/router', () => service.overview(), {
      response: { 200: RouterOverviewSchema, 401: ControllerError },
      detail: {
        tags,
        summary: "The router's models, traffic, sleep states and sleep candidates, for the dashboard",
        description:
          '200: {models (GET /models data), traffic (GET /traffic/stats, all time), sleep (GET /sleep/status ' +
          'models), candidates (GET /sleep/candidates)}, as the router listener answers them.',
        'x-required-role': 'admin-readonly',
      },
    })
    .post(
      '/api/dashboard/router/models/:name/sleep',
      async ({ params, set }) => {
        const r = await service.sleepAction(params.name, bearer())
        set.status = r.httpStatus
        return r.body
      },
      {
        params: Name,
        response: {
          200: ActionResultSchema,
          409: ActionResultSchema,
          502: ActionResultSchema,
          ...actionErrors,
        },
        detail: { tags, summary: 'Sleep a router model (as POST /action/sleep/{model} on the router)' },
      },
    )
    .post(
      '/api/dashboard/router/models/:name/wake',
      async ({ params, set }) => {
        const r = await service.wakeAction(params.name, bearer())
        set.status = r.httpStatus
        return r.body
      },
      {
        params: Name,
        response: {
          200: ActionResultSchema,
          409: ActionResultSchema,
          502: ActionResultSchema,
          ...actionErrors,
        },
        detail: { tags, summary: 'Wake a router model (as POST /action/wakeup/{model} on the router)' },
      },
    )
}
