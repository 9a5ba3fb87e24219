import { signal } from '@preact/signals'
import { followStream } from './sse.ts'

/**
 * The dashboard's one live stream (`/api/dashboard/events`), which every plugin feeds (each names
 * the events it publishes in its definition). The shell opens it once logged in; a plugin's client
 * module subscribes to its events with `onLive` and keeps its own state current from them, so no
 * page reads anything on a timer.
 */
export const connection = signal<'connecting' | 'live' | 'down'>('connecting')

type Handler = (data: unknown) => void
const handlers = new Map<string, Set<Handler>>()

/** onLive calls `handler` with each `event` on the stream (its data parsed); returns the unsubscribe. */
export function onLive<T>(event: string, handler: (data: T) => void): () => void {
  let set = handlers.get(event)
  if (!set) {
    set = new Set()
    handlers.set(event, set)
  }
  const h = handler as Handler
  set.add(h)
  return () => set.delete(h)
}

/** startLive opens the event stream (once logged in); returns the function that closes it. */
export function startLive(): () => void {
  connection.value = 'connecting'
  return followStream('/api/dashboard/events', {
    onOpen: () => {
      connection.value = 'live'
    },
    onMessage: (m) => {
      const set = handlers.get(m.event)
      if (!set?.size) return
      const data = JSON.parse(m.data) as unknown
      for (const h of set) {
        try {
          h(data)
        } catch (err) {
          console.error(`live event '${m.event}' handler failed`, err)
        }
      }
    },
    onDown: () => {
      connection.value = 'down'
    },
  })
}
