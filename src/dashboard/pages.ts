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

/**
 * pageAddresses: what a typed page address answers. The dashboard's routes live in the URL fragment
 * (`/#/models`), so a GET of a page's path (`/models`, `/models/abc`, `/benchmarks/compare/a/b`) that
 * no route of the listener serves answers 302 to `/#<path>`, where the page opens. Every page of a
 * compiled-in plugin counts, on or off (an off one says so at its address), so the answer tells
 * nothing the public bundle does not; `/` is the page itself. Returns the redirect for a path, or
 * null when it is no page's. Consulted only when no route matched (createBaseApp's fallback), so it
 * never shadows one (`/metrics` stays Prometheus's; its dashboard page opens at `/#/metrics`).
 */
export function pageAddresses(
  definitions: readonly PluginDefinition[],
): (pathname: string) => Response | null {
  const patterns = [...definitions.flatMap((d) => d.dashboard?.pages ?? []), ...HOST_PAGES]
    .map((p) => p.path)
    .filter((p) => p !== '/')
    .map((p) => p.split('/'))
  return (pathname) => {
    const got = pathname.split('/')
    if (!patterns.some((want) => fits(want, got))) return null
    return new Response(null, {
      status: 302,
      headers: { location: `/#${pathname}`, 'cache-control': 'no-cache' },
    })
  }
}

/** fits: a page path's segments (`:name` any non-empty one) against a request path's, as the client's router matches. */
function fits(want: readonly string[], got: readonly string[]): boolean {
  if (want.length !== got.length) return false
  return want.every((part, i) => (part.startsWith(':') ? (got[i] ?? '') !== '' : part === got[i]))
}
