import type { PluginDefinition } from '../host/plugin.ts'
import type { DashboardPage } from './contract.ts'
import type { DashboardPagesSchema } from './schemas.ts'

/** HOST_PAGES: the host's own pages (their components: client/pages/index.ts), after the plugins'. */
export const HOST_PAGES: readonly DashboardPage[] = [
  { id: 'keys', title: 'Inference keys', nav: 'Keys', path: '/keys' },
]

/**
 * dashboardPages: the one list the dashboard's navigation and routes come from: the pages of the
 * plugins that are on (in the plugin list's order, each plugin's in its own), then the host's; and
 * the addresses of the pages of compiled-in plugins that are off, where the page says so.
 */
export function dashboardPages(
  definitions: readonly PluginDefinition[],
  on: (id: string) => boolean,
): typeof DashboardPagesSchema.static {
  const pages = definitions
    .filter((d) => on(d.id))
    .flatMap((d) => (d.dashboard?.pages ?? []).map((p) => ({ plugin: d.id, ...p })))
  pages.push(...HOST_PAGES.map((p) => ({ plugin: 'host', ...p })))
  const off = definitions
    .filter((d) => !on(d.id))
    .flatMap((d) => (d.dashboard?.pages ?? []).map((p) => ({ plugin: d.id, path: p.path })))
  return { pages, off }
}
