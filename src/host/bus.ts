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

export class EventBus {
  private readonly hubs = new Map<string, ReplayHub<unknown>>()

  on<K extends keyof BusEvents & string>(event: K, handler: Handler<BusEvents[K]>): () => void {
    let hub = this.hubs.get(event)
    if (!hub) {
      hub = new ReplayHub({ onError: (err) => console.error(`event handler for '${event}' failed:`, err) })
      this.hubs.set(event, hub)
    }
    return hub.subscribe(handler as Handler<unknown>)
  }

  emit<K extends keyof BusEvents & string>(event: K, payload: BusEvents[K]): void {
    this.hubs.get(event)?.publish(payload)
  }
}
