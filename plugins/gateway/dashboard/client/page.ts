import type { ComponentType } from 'preact'

/**
 * Page: one view of the dashboard, in its own file under pages/, listed in pages/index.ts (the
 * registry the shell builds its navigation and routes from). To add one: write pages/<name>.tsx
 * exporting a Page, and add it to the registry.
 */
export interface Page {
  id: string
  /** title: the heading and the browser tab's title. */
  title: string
  /** path: the route in the URL fragment, e.g. `/models/:id` (`:name` parts reach the component). */
  path: string
  /** nav: the label in the navigation; absent for pages reached by a link (an instance's page). */
  nav?: string
  component: ComponentType<{ params: Record<string, string> }>
  /** requires: the optional plugin the page shows; without it the page is left out of the navigation. */
  requires?: 'benchmarks' | 'router' | 'cluster'
}
