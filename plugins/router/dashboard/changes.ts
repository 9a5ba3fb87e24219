import type { Static } from 'elysia'
import type { RouterOverviewSchema } from '../schemas.ts'

export type RouterOverview = Static<typeof RouterOverviewSchema>

declare module '../../../src/host/bus.ts' {
  interface BusEvents {
    /**
     * router.changed: the router's overview (as GET /api/dashboard/router answers) after something
     * changed it: a request ended, a sleep or wake began or ended, a gateway instance changed, an
     * idle check ran (RouterService.changes). The dashboard's live stream relays it.
     */
    'router.changed': RouterOverview
  }
}
