import { type AppError, proxyError } from '../http/errors.ts'
/**
 * HoldQueue: the requests one model holds while it wakes or loads, in priority order (an inference
 * key's priority: 0 high, 1 normal, 2 low; then first come). When the model serves they go on in
 * that order; when its bounded queue is full, a request of higher priority takes the place of the
 * newest waiter of the lowest priority below its own, which is refused (`displaced`), and anything
 * else is refused itself. A request without a key counts as normal.
 *
 * In a bounded queue each inference key (a party) holds at most its share of the places (queueShare):
 * one key's flood during a load leaves room for the others. Requests without a key (the static
 * key, open inference) are no party: only the queue's own bound holds them.
 */
export interface Waiter {
  readonly priority: number
  /** party: the inference key it came with (its id), null for none. */
  readonly party: string | null
  /** Settles when the wait is over: released (the wake it waited for ended), or displaced. */
  readonly done: Promise<void>
}

interface Entry extends Waiter {
  readonly seq: number
  readonly wake: Promise<void>
  resolve(): void
  reject(err: Error): void
}

/** Displaced: a held request that gave its place to one of higher priority (answered 429 queue_full). */
export class Displaced extends Error {
  constructor() {
    super('displaced by a request of higher priority')
  }
}

/** Seat: who asks for a place: its priority, and its party with the places it may hold (null: no party). */
export interface Seat {
  readonly priority: number
  readonly party: string | null
  /** share: at most this many of the party's requests wait at once (null: no bound of its own). */
  readonly share: number | null
}

/**
 * queueShare: the places of a queue of `max` one key may hold: half of them (at least 1), or the
 * key's own max_concurrent when that says more; never more than the queue has.
 */
export function queueShare(max: number, maxConcurrent: number | null): number {
  return Math.min(max, Math.max(1, Math.floor(max / 2), maxConcurrent ?? 0))
}

export class HoldQueue {
  private readonly entries: Entry[] = []
  /** How many waiters each party has now. */
  private readonly parties = new Map<string, number>()
  private seq = 0

  get size(): number {
    return this.entries.length
  }

  /**
   * enter: a request (`seat`) waits for `wake` (which the queue follows: when one ends, the
   * waiters are released in order; when one fails, its waiters are failed). With `max`, a party
   * that holds its share is refused (null), and a full queue makes room by displacing the newest
   * waiter of the lowest priority below the seat's; null when there is none (refuse it).
   */
  enter(seat: Seat, wake: Promise<void>, max: number | null): Waiter | null {
    const { priority, party } = seat
    if (max !== null && !this.withinShare(seat)) return null
    if (max !== null && this.entries.length >= max) {
      const victim = this.lowest()
      if (!victim || victim.priority <= priority) return null
      this.remove(victim)
      victim.reject(new Displaced())
    }
    let resolve!: () => void
    let reject!: (err: Error) => void
    const done = new Promise<void>((res, rej) => {
      resolve = res
      reject = rej
    })
    // A waiter nobody awaits any more (its client left) must not turn a rejection into an unhandled one.
    done.catch(() => {})
    const entry: Entry = { priority, party, seq: this.seq++, wake, done, resolve, reject }
    this.entries.push(entry)
    if (party !== null) this.parties.set(party, (this.parties.get(party) ?? 0) + 1)
    wake.then(
      () => this.settle(wake, null),
      (err: Error) => this.settle(wake, err),
    )
    return entry
  }

  /** hasRoom: whether `seat` would get a place among at most `max` (enter would not refuse it). */
  hasRoom(seat: Seat, max: number): boolean {
    if (!this.withinShare(seat)) return false
    if (this.entries.length < max) return true
    const victim = this.lowest()
    return victim !== null && victim.priority > seat.priority
  }

  /** waiting: how many requests of `party` wait now. */
  waiting(party: string): number {
    return this.parties.get(party) ?? 0
  }

  /** leave: a waiter stops waiting (its client went away, its deadline passed). */
  leave(w: Waiter): void {
    this.remove(w as Entry)
  }

  /** withinShare: the seat's party holds fewer places than its share (always, for no party). */
  private withinShare(seat: Seat): boolean {
    return seat.party === null || seat.share === null || this.waiting(seat.party) < seat.share
  }

  /**
   * settle: a wake ended. Done, the model serves: every waiter goes on, highest priority first,
   * then in arrival order (each request holds its own promise of the model's one wake). Failed: its
   * own waiters are told.
   */
  private settle(wake: Promise<void>, err: Error | null): void {
    const mine = err ? this.entries.filter((e) => e.wake === wake) : [...this.entries]
    if (mine.length === 0) return
    for (const e of mine) this.remove(e)
    mine.sort((a, b) => a.priority - b.priority || a.seq - b.seq)
    for (const e of mine) {
      if (err) e.reject(err)
      else e.resolve()
    }
  }

  /** lowest: the newest waiter of the lowest priority (the one a higher priority displaces). */
  private lowest(): Entry | null {
    let out: Entry | null = null
    for (const e of this.entries)
      if (!out || e.priority > out.priority || (e.priority === out.priority && e.seq > out.seq)) out = e
    return out
  }

  private remove(e: Entry): void {
    const i = this.entries.indexOf(e)
    if (i < 0) return
    this.entries.splice(i, 1)
    if (e.party === null) return
    const n = (this.parties.get(e.party) ?? 1) - 1
    if (n > 0) this.parties.set(e.party, n)
    else this.parties.delete(e.party)
  }
}

/**
 * queueFull: the answer of every listener to a request a model's full queue refuses (OpenAI's 429
 * shape, so its clients back off for `Retry-After`).
 */
export function queueFull(model: string, seconds: number): AppError {
  return proxyError(
    429,
    'rate_limit_error',
    'queue_full',
    `Model '${model}' has as many requests waiting for it as its queue holds; retry in ${seconds} s`,
    undefined,
    { 'retry-after': String(seconds) },
  )
}

/** Retry-After of a request a stopping server answered (another pod, or this one restarted, serves it). */
const RETRY_AFTER_STOPPING_SECONDS = 5

/**
 * serverStopping: the answer of every listener to a request held for a model when the server
 * stops (a queue's requests as the shutdown begins, a wake's once the drain is over): it was not
 * served here, and may be sent again.
 */
export function serverStopping(model: string): AppError {
  return proxyError(
    503,
    'service_unavailable',
    'server_stopping',
    `The server is stopping; the request for model '${model}' was not served. Retry in ${RETRY_AFTER_STOPPING_SECONDS} s`,
    undefined,
    { 'retry-after': String(RETRY_AFTER_STOPPING_SECONDS) },
  )
}
