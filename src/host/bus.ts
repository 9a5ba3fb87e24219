/**
 * EventBus is the typed in-process pub/sub plugins use to talk without importing each other.
 * Events are declared by augmenting `BusEvents` (declaration merging) in the emitting module, so
 * subscribers get the payload type. A dashboard or the cluster plugin can subscribe to the same
 * events later.
 */
// biome-ignore lint/suspicious/noEmptyInterface: extended by declaration merging in each owner module
export interface BusEvents {}

type Handler<T> = (payload: T) => void

export class EventBus {
  private readonly handlers = new Map<string, Set<Handler<unknown>>>()

  on<K extends keyof BusEvents & string>(event: K, handler: Handler<BusEvents[K]>): () => void {
    let set = this.handlers.get(event)
    if (!set) {
      set = new Set()
      this.handlers.set(event, set)
    }
    set.add(handler as Handler<unknown>)
    return () => set.delete(handler as Handler<unknown>)
  }

  /** emit calls every handler synchronously; a throwing handler never breaks the emitter. */
  emit<K extends keyof BusEvents & string>(event: K, payload: BusEvents[K]): void {
    const set = this.handlers.get(event)
    if (!set) return
    for (const handler of set) {
      try {
        handler(payload)
      } catch (err) {
        console.error(`event handler for '${event}' failed:`, err)
      }
    }
  }
}
