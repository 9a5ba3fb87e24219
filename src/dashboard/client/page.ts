import type { ComponentType } from 'preact'

/**
 * DashboardClient: what a plugin's client module (its definition's `dashboard.client`) gives the
 * shell: the component of each page it contributes, by page id. The pages' titles, paths and
 * navigation come from the server (GET /api/dashboard/pages: the plugins that are on), so they are
 * written once, in the plugin's definition; the bundle holds every compiled-in plugin's components.
 * A module that keeps state from the live stream registers its handlers (live.ts `onLive`) when
 * it is imported.
 */
export interface DashboardClient {
  pages: Record<string, PageComponent>
}

/** PageComponent: a page's view; `params` are the `:name` parts of its path. */
export type PageComponent = ComponentType<{ params: Record<string, string> }>

/** defineClient keeps a client module's shape checked where it is written. */
export function defineClient(client: DashboardClient): DashboardClient {
  return client
}
