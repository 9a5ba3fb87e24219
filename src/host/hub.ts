/**
 * ReplayHub is the one publish/subscribe of the process. The owner publishes events; a subscriber
 * first gets the replay (what a late comer needs to see the current state), then the live events in
 * publish order, until it unsubscribes or the owner ends the hub (then its `onEnd` runs once).
 *
 * The replay is either the events the hub keeps (`keep` names a slot per event, `limit` bounds
 * each slot, oldest dropped first: "the last 2000 log lines and the latest status") or, with
 * `snapshot`, computed from the owner's state at subscribe time. Without either there is no replay
 * (the bus).
 *
 * Delivery is synchronous and never blocks the publisher: a listener that must not fall behind
 * queues the event itself (the SSE sink does, with a bounded backlog). A publish or end() from
 * inside a listener is queued until the current dispatch is over, so every subscriber sees the
 * same order. A listener that unsubscribes during a dispatch gets nothing more, not even the rest
 * of that dispatch; one that subscribes during a dispatch gets the event in its replay, not twice.
 * A throwing listener is reported to `onError` and never stops the others or the publisher.
 *
 * A move's progress, for instance: `new ReplayHub<MoveEvent>({ keep: () => 'state' })`, publish
 * each phase, end() after completed/failed; a late SSE client gets the current phase, the rest
 * live, and its stream closes from `onEnd`.
 */
export interface ReplayHubOptions<E> {
  /** keep names the replay slot an event is kept in; undefined (or no `keep`): not kept. */
  keep?: (e: E) => string | undefined
  /** How many events each slot keeps, the oldest dropped first (default 1: the latest). */
  limit?: number | ((slot: string) => number)
  /** snapshot computes the replay from the owner's state instead of from kept events. */
  snapshot?: () => E[]
  /** onError hears a listener or onEnd that threw (default: console.error). */
  onError?: (err: unknown) => void
}

export interface SubscribeOptions<E> {
  /** Only events that pass, replayed and live. */
  filter?: (e: E) => boolean
  /** false: live events only; a predicate: which replayed events are sent (default: all). */
  replay?: boolean | ((e: E) => boolean)
  /** Runs once when the hub ends (right after the replay when it already has); not after unsubscribe. */
  onEnd?: () => void
}

interface Kept<E> {
  seq: number
  event: E
}

interface Subscriber<E> {
  listener: (e: E) => void
  filter: ((e: E) => boolean) | undefined
  onEnd: (() => void) | undefined
  /** The last sequence number its replay covered: it gets only later events. */
  after: number
  active: boolean
}

const END: unique symbol = Symbol('end')

export class ReplayHub<E> {
  private readonly slots = new Map<string, Kept<E>[]>()
  private readonly subscribers = new Set<Subscriber<E>>()
  private readonly pending: (E | typeof END)[] = []
  private dispatching = false
  private endQueued = false
  private isEnded = false
  private seq = 0

  constructor(private readonly opts: ReplayHubOptions<E> = {}) {}

  publish(event: E): void {
    this.pending.push(event)
    this.drain()
  }

  /** end closes every subscription after the events published before it; later subscribers get the replay and onEnd. */
  end(): void {
    if (this.endQueued) return
    this.endQueued = true
    this.pending.push(END)
    this.drain()
  }

  get ended(): boolean {
    return this.isEnded
  }

  get subscriberCount(): number {
    return this.subscribers.size
  }

  /** kept returns the kept events of one slot, or of all slots, oldest first. */
  kept(slot?: string): E[] {
    if (slot !== undefined) return (this.slots.get(slot) ?? []).map((k) => k.event)
    const all: Kept<E>[] = []
    for (const list of this.slots.values()) all.push(...list)
    if (this.slots.size > 1) all.sort((a, b) => a.seq - b.seq)
    return all.map((k) => k.event)
  }

  /** subscribe sends the replay, then live events until the returned function is called or the hub ends. */
  subscribe(listener: (e: E) => void, opts: SubscribeOptions<E> = {}): () => void {
    const { filter, replay = true, onEnd } = opts
    const sub: Subscriber<E> = { listener, filter, onEnd, after: 0, active: true }
    // What a listener publishes during its replay is queued until it is subscribed.
    const outer = this.dispatching
    this.dispatching = true
    try {
      if (replay !== false) {
        for (const e of this.opts.snapshot ? this.opts.snapshot() : this.kept()) {
          if ((replay === true || replay(e)) && (!filter || filter(e))) this.call(sub, e)
        }
      }
    } finally {
      this.dispatching = outer
    }
    if (this.isEnded) {
      this.run(onEnd)
      return () => {}
    }
    sub.after = this.seq
    this.subscribers.add(sub)
    this.drain()
    return () => {
      sub.active = false
      this.subscribers.delete(sub)
    }
  }

  private drain(): void {
    if (this.dispatching) return
    this.dispatching = true
    try {
      while (this.pending.length > 0) {
        const next = this.pending.shift()!
        if (next === END) this.finish()
        else this.dispatch(next)
      }
    } finally {
      this.dispatching = false
    }
  }

  private dispatch(event: E): void {
    const seq = ++this.seq
    const slot = this.opts.keep?.(event)
    if (slot !== undefined) this.retain(slot, seq, event)
    // A Set visits members added during the loop: `after` keeps them to the events after their replay.
    for (const sub of this.subscribers) {
      if (sub.active && seq > sub.after && (!sub.filter || sub.filter(event))) this.call(sub, event)
    }
  }

  private retain(slot: string, seq: number, event: E): void {
    const { limit = 1 } = this.opts
    const max = typeof limit === 'number' ? limit : limit(slot)
    let list = this.slots.get(slot)
    if (!list) {
      list = []
      this.slots.set(slot, list)
    }
    list.push({ seq, event })
    if (list.length > max) list.splice(0, list.length - max)
  }

  private finish(): void {
    this.isEnded = true
    const subs = [...this.subscribers]
    this.subscribers.clear()
    for (const sub of subs) sub.active = false
    for (const sub of subs) this.run(sub.onEnd)
  }

  private call(sub: Subscriber<E>, event: E): void {
    if (!sub.active) return
    try {
      sub.listener(event)
    } catch (err) {
      this.report(err)
    }
  }

  private run(onEnd: (() => void) | undefined): void {
    try {
      onEnd?.()
    } catch (err) {
      this.report(err)
    }
  }

  private report(err: unknown): void {
    if (this.opts.onError) this.opts.onError(err)
    else console.error('event listener failed:', err)
  }
}
