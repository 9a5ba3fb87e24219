import type { Static } from 'elysia'
import { abortable } from '../../src/host/abortable.ts'
import { AppError, conflict } from '../../src/http/errors.ts'
import type { InstanceStatusSchema } from './schemas.ts'

/**
 * An instance's lifecycle as a transition table (as llama-swap's process states are): its state,
 * the control operation in progress, whether routing may send it new requests, and its in-flight
 * request count. Every change goes through a method that checks it against the table at once
 * (nothing awaits between the check and the change) and reports it; anything else is refused with
 * 409, which tests see as a throw and the API as its error body. `waitUntil` and `drained` are
 * how others wait on an instance: they wake on the change itself, never on a timer.
 *
 *   starting ──▶ active ◀──▶ sleeping
 *      │           │            │
 *      ├───────────┴─────┬──────┴──▶ failed ──▶ stopping
 *      ▼                 ▼                         │
 *   stopping ◀───────────┘                         ▼
 *      └──────────────────────────────────────▶ removed
 */
type InstanceStatus = Static<typeof InstanceStatusSchema>
export type InstanceState = InstanceStatus | 'removed'

/** The control operations; one at a time per instance. A move marks both its source and its target. */
export type Operation = 'sleep' | 'wake' | 'move'

const TRANSITIONS: Readonly<Record<InstanceState, readonly InstanceState[]>> = {
  starting: ['active', 'failed', 'stopping'],
  active: ['sleeping', 'failed', 'stopping'],
  sleeping: ['active', 'failed', 'stopping'],
  failed: ['stopping'],
  stopping: ['removed'],
  removed: [],
}

/** The states an operation may begin in (a move's target begins its part while starting). */
const BEGIN_IN: Readonly<Record<Operation, readonly InstanceState[]>> = {
  sleep: ['active'],
  wake: ['sleeping'],
  move: ['starting', 'active', 'sleeping'],
}

export function isTransition(from: InstanceState, to: InstanceState): boolean {
  return TRANSITIONS[from].includes(to)
}

export const STATES = Object.keys(TRANSITIONS) as InstanceState[]

/** Change is what a lifecycle reports, once per change. */
export type Change =
  | { kind: 'state'; previous: InstanceState; current: InstanceState; message: string }
  | { kind: 'operation'; operation: Operation; running: boolean }
  | { kind: 'routing'; routing: boolean }

export interface WaitOptions {
  signal?: AbortSignal
  timeoutMs?: number
  /** What is awaited, for the error message. */
  what?: string
}

export class Lifecycle {
  private current: InstanceState
  private op: Operation | null = null
  private routingOn: boolean
  private open = 0
  private readonly waiters = new Set<() => void>()

  constructor(
    readonly id: string,
    initial: InstanceState,
    opts: { routing?: boolean; operation?: Operation | null } = {},
    private readonly report: (change: Change) => void = () => {},
  ) {
    this.current = initial
    this.routingOn = opts.routing ?? true
    if (opts.operation) this.begin(opts.operation)
  }

  get state(): InstanceState {
    return this.current
  }

  get operation(): Operation | null {
    return this.op
  }

  /** routing: whether routing may pick this instance (a move's target until the switch: no). */
  get routing(): boolean {
    return this.routingOn
  }

  get inFlight(): number {
    return this.open
  }

  /** takesRequests: active, routed to, and not going to sleep (a request would reach an engine mid-sleep). */
  get takesRequests(): boolean {
    return this.current === 'active' && this.routingOn && this.op !== 'sleep'
  }

  /** to moves to `next` if the table allows it from the current state; otherwise 409 INVALID_STATE. */
  to(next: InstanceState, message: string): InstanceState {
    const previous = this.current
    if (!isTransition(previous, next))
      throw conflict(`Instance ${this.id} is ${previous}; it cannot become ${next}`, 'INVALID_STATE')
    this.current = next
    // An instance that can no longer serve is taken out of routing; sleeping keeps it (wake resumes it).
    if (next === 'failed' || next === 'stopping' || next === 'removed') this.routingOn = false
    this.changed({ kind: 'state', previous, current: next, message })
    return previous
  }

  /** begin starts a control operation: 409 while another runs, or in a state it cannot start from. */
  begin(op: Operation): void {
    if (this.op)
      throw conflict(`Instance ${this.id} is busy (${this.op} in progress)`, 'OPERATION_IN_PROGRESS')
    if (!BEGIN_IN[op].includes(this.current))
      throw conflict(`Instance ${this.id} is ${this.current}; ${op} cannot start`, 'INVALID_STATE')
    this.op = op
    this.changed({ kind: 'operation', operation: op, running: true })
  }

  /** end finishes the operation that is running; ending another one is a bug (500). */
  end(op: Operation): void {
    if (this.op !== op)
      throw new AppError(
        500,
        'INTERNAL_ERROR',
        `Instance ${this.id}: ${op} ended but ${this.op ?? 'nothing'} ran`,
      )
    this.op = null
    this.changed({ kind: 'operation', operation: op, running: false })
  }

  /** route turns routing to this instance on or off; on only while it is active or sleeping. */
  route(on: boolean): void {
    if (on === this.routingOn) return
    if (on && this.current !== 'active' && this.current !== 'sleeping')
      throw conflict(`Instance ${this.id} is ${this.current}; it cannot take requests`, 'INVALID_STATE')
    this.routingOn = on
    this.changed({ kind: 'routing', routing: on })
  }

  /** acquire counts a request routed to this instance; release (once per acquire) ends it. */
  acquire(): void {
    this.open++
  }

  release(): void {
    this.open--
    if (this.open === 0) this.notify()
  }

  /**
   * waitUntil resolves once `ready` holds (at once if it holds now), re-checked on every change.
   * It rejects when the instance is removed without it holding, or on the signal or deadline.
   */
  waitUntil(ready: (l: Lifecycle) => boolean, opts: WaitOptions = {}): Promise<void> {
    if (ready(this)) return Promise.resolve()
    const what = opts.what ?? `instance ${this.id}`
    if (this.current === 'removed') return Promise.reject(removedError(this.id, what))
    let check!: () => void
    const waiting = new Promise<void>((resolve, reject) => {
      check = () => {
        if (ready(this)) resolve()
        else if (this.current === 'removed') reject(removedError(this.id, what))
      }
      this.waiters.add(check)
    })
    return abortable(waiting, { ...opts, what }).finally(() => this.waiters.delete(check))
  }

  /** drained resolves when no request is in flight on the instance. */
  drained(opts: WaitOptions = {}): Promise<void> {
    return this.waitUntil((l) => l.inFlight === 0, { what: `the drain of ${this.id}`, ...opts })
  }

  private changed(change: Change): void {
    this.report(change)
    this.notify()
  }

  private notify(): void {
    for (const check of [...this.waiters]) check()
  }
}

function removedError(id: string, what: string): AppError {
  return conflict(`Instance ${id} was removed while waiting for ${what}`, 'INVALID_STATE')
}
