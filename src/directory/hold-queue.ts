import { type AppError, proxyError } from '../http/errors.ts'
/**
 * HoldQueue: the requests one model holds while it wakes or loads, in priority order (an inference
 * key's priority: 0 high, 1 normal, 2 low; then first come). When the model serves they go on in
 * that order; when its bounded queue is full, a request of higher priority takes the place of the
 * newest waiter of the lowest priority below its own, which is refused (`displaced`), and anything
 * else is refused itself. A request without a key counts as normal.
 */
export interface Waiter {
  readonly priority: number
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

export class HoldQueue {
  private readonly entries: Entry[] = []
  private seq = 0

  get size(): number {
    return this.entries.length
  }

  /**
   * enter: a request of `priority` waits for `wake` (which the queue follows: when one ends, the
   * waiters are released in order; when one fails, its waiters are failed). With `max`, a full queue makes room by displacing
   * the newest waiter of the lowest priority below `priority`; null when there is none (refuse it).
   */
  enter(priority: number, wake: Promise<void>, max: number | null): Waiter | null {
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
    const entry: Entry = { priority, seq: this.seq++, wake, done, resolve, reject }
    this.entries.push(entry)
    wake.then(
      () => this.settle(wake, null),
      (err: Error) => this.settle(wake, err),
    )
    return entry
  }

  /** hasRoom: whether a request of `priority` would get a place among at most `max` (enter would not refuse it). */
  hasRoom(priority: number, max: number): boolean {
    if (this.entries.length < max) return true
    const victim = this.lowest()
    return victim !== null && victim.priority > priority
  }

  /** leave: a waiter stops waiting (its client went away, its deadline passed). */
  leave(w: Waiter): void {
    const i = this.entries.indexOf(w as Entry)
    if (i >= 0) this.entries.splice(i, 1)
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
    if (i >= 0) this.entries.splice(i, 1)
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
