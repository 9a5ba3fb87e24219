import { ReplayHub } from './hub.ts'

/**
 * EventBus is the typed in-process pub/sub plugins use to talk without importing each other.
 * Events are declared by augmenting `BusEvents` (declaration merging) in the emitting module, so
 * subscribers get the payload type. A dashboard or the cluster plugin can subscribe to the same
 * events later. Each event name is a ReplayHub without replay: handlers run synchronously, in
 * emit order, and a throwing handler never breaks the emitter.
 */
// biome-ignore lint/suspicious/noEmptyInterface: extended by declaration merging in each owner module
export interface BusEvents {}

type Handler<T> = (payload: T) => void

/** BusChannel: one event's emitter (EventBus.channel). */
export interface BusChannel<T> {
  emit(payload: T): void
  /** Whether anyone listens now. */
  readonly heard: boolean
}

export class EventBus {
  private readonly hubs = new Map<string, ReplayHub<unknown>>()

  on<K extends keyof BusEvents & string>(event: K, handler: Handler<BusEvents[K]>): () => void {
    return this.hub(event).subscribe(handler as Handler<unknown>)
  }

  emit<K extends keyof BusEvents & string>(event: K, payload: BusEvents[K]): void {
    this.hubs.get(event)?.publish(payload)
  }

  /**
   * channel: one event's emitter, for a hot path to keep: no lookup per emit, and `heard` tells
   * whether anyone listens now (so no payload is built for nobody). Subscribers added later hear it.
   */
  channel<K extends keyof BusEvents & string>(event: K): BusChannel<BusEvents[K]> {
    const hub = this.hub(event)
    return {
      emit: (payload) => hub.publish(payload),
      get heard() {
        return hub.subscriberCount > 0
      },
    }
  }

  private hub(event: string): ReplayHub<unknown> {
    let hub = this.hubs.get(event)
    if (!hub) {
      hub = new ReplayHub({ onError: (err) => console.error(`event handler for '${event}' failed:`, err) })
      this.hubs.set(event, hub)
    }
    return hub
  }
}
