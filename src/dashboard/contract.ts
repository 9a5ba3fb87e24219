import type { BusEvents } from '../host/bus.ts'

/**
 * The dashboard's part of the plugin contract. The dashboard is the host's (src/dashboard/): its
 * page, its assets, its one live stream and its list of pages. A plugin contributes pages (written
 * once, here: the shell builds its navigation from the list the server gives, the plugins that are
 * on) and the events it publishes for them into the live stream, so no page reads on a timer.
 */
export interface DashboardPage {
  id: string
  /** title: the heading and the browser tab's title. */
  title: string
  /** path: the route in the URL fragment, e.g. `/models/:id` (`:name` parts reach the component). */
  path: string
  /** nav: the label in the navigation; absent for pages reached by a link (an instance's page). */
  nav?: string
}

export interface DashboardContribution {
  /**
   * client: the absolute path of the plugin's client module, bundled into the page; its default
   * export (`defineClient`, src/dashboard/client/page.ts) maps each page id to its component.
   */
  client: string
  /** pages: the plugin's pages in navigation order. */
  pages: DashboardPage[]
  /**
   * events: the bus events the plugin publishes for its pages; the live stream relays each under
   * its own name with its payload as it is (the plugin's client applies it: `onLive`).
   */
  events?: (keyof BusEvents & string)[]
}

/** LiveSend: puts one event on one client's live stream. */
export type LiveSend = (event: string, data: unknown) => void

/**
 * LiveFeed: what a plugin sends on each new live connection beyond its relayed bus events (its
 * current state first, events derived per connection); returns what ends it when the client goes.
 */
export type LiveFeed = (send: LiveSend) => () => void
