import type { BusEvents, EventBus } from '../host/bus.ts'

/** PUBLISH_EVERY_MS: a view is published at most this often by default. */
export const PUBLISH_EVERY_MS = 1000

/**
 * ViewPublisher publishes a plugin's view on the bus (an event the plugin names in its
 * `dashboard.events`, so the live stream relays it) when something may have changed it. The
 * plugin nudges it at each change; a burst is one event (at most one every `everyMs`, the first at
 * once after a quiet spell), and a view equal to the last one published is not sent again, so a
 * nudge costs one read of the view and nothing more when nothing changed.
 */
export class ViewPublisher<K extends keyof BusEvents & string> {
  private timer: ReturnType<typeof setTimeout> | undefined
  private lastAt = 0
  private last = ''
  private stopped = false

  constructor(
    private readonly bus: EventBus,
    private readonly event: K,
    private readonly read: () => BusEvents[K],
    private readonly everyMs = PUBLISH_EVERY_MS,
  ) {}

  /** nudge: the view may have changed; publish it soon. */
  nudge(): void {
    if (this.timer || this.stopped) return
    const wait = Math.max(0, this.lastAt + this.everyMs - Date.now())
    this.timer = setTimeout(() => {
      this.timer = undefined
      this.publish()
    }, wait)
  }

  /** stop: no more events (the plugin is stopping); a pending one is dropped. */
  stop(): void {
    this.stopped = true
    clearTimeout(this.timer)
    this.timer = undefined
  }

  private publish(): void {
    this.lastAt = Date.now()
    const view = this.read()
    const text = JSON.stringify(view)
    if (text === this.last) return
    this.last = text
    this.bus.emit(this.event, view)
  }
}
