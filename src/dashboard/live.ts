import type { EventBus } from '../host/bus.ts'
import { sseResponse } from '../http/sse.ts'
import type { LiveFeed } from './contract.ts'

/**
 * LiveSource: every plugin that feeds the live stream, in plugin order: the bus events it names
 * in its definition (`dashboard.events`) and its per-connection feed (`live` from its setup).
 */
export interface LiveSource {
  bus: EventBus
  feeds(): { events: readonly string[]; live?: LiveFeed }[]
}

/**
 * liveStream is the dashboard's one event stream (`GET /api/dashboard/events`): what every page
 * needs to stay current without polling, over a single connection (a browser opens at most six to
 * one host over HTTP/1.1, so one stream per plugin or page would starve the page's own requests).
 * Each feed sends its current state first, so a client that connects (or reconnects) starts from it.
 */
export function liveStream(src: LiveSource, signal: AbortSignal): Response {
  return sseResponse(
    (sink) => {
      const send = (event: string, data: unknown) => sink.send(event, data)
      const offs: (() => void)[] = []
      for (const feed of src.feeds()) {
        for (const event of feed.events)
          offs.push(src.bus.on(event as never, (data: unknown) => send(event, data)))
        if (feed.live) offs.push(feed.live(send))
      }
      return () => {
        for (const off of offs.splice(0)) off()
      }
    },
    { signal },
  )
}
