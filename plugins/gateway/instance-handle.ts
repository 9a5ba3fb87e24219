import type { Readiness, SleepReason, SleepState } from '../../src/directory/backend.ts'
import type { SpanBase } from '../../src/host/telemetry/spans.ts'
import type { SleepOptions, WakeResult } from './api.ts'
import type { ManagedInstance } from './instance.ts'
import type { InstanceHandle } from './proxy/instance-backend.ts'

/** What an instance's handle asks of the gateway: its one sleep and its one wake, and its queue. */
export interface InstanceControl {
  sleep(inst: ManagedInstance, level: 1 | 2, opts: SleepOptions): Promise<unknown>
  /**
   * wake is joinable: a second caller while it runs gets the same wake (sleep-wake.ts), with room made
   * first. `trace`: the waiting request's span (the wake's span goes under it, or an event says it joined).
   */
  wake(inst: ManagedInstance, trace?: SpanBase | null): Promise<WakeResult>
  /** queue: a catalogued model's requests wait in its queue while it loads or wakes (null: not catalogued). */
  queue(inst: ManagedInstance): { max: number; timeoutMs: number } | null
  /** abandoned: every request waiting for the instance left; true when its load was cancelled. */
  abandoned(inst: ManagedInstance): boolean
  /** pinned: the host keeps the instance's model resident (a pinned catalogue entry). */
  pinned(inst: ManagedInstance): boolean
}

/**
 * ManagedHandle: a managed instance as the directory's instance backend reads it. Readiness comes
 * from the lifecycle (lifecycle.ts), the in-flight count is the lifecycle's (the one count the
 * sleep and move drains wait on), and a wake waits through whatever the instance is doing first
 * (a sleep still draining, another wake, a move) on the lifecycle's own changes, never a timer.
 */
export class ManagedHandle implements InstanceHandle {
  constructor(
    private readonly inst: ManagedInstance,
    private readonly control: InstanceControl,
  ) {}

  get id(): string {
    return this.inst.id
  }

  get servedModelName(): string {
    return this.inst.row.served_model_name
  }

  get modelPath(): string {
    return this.inst.row.model_path
  }

  get baseUrl(): string {
    return this.inst.baseUrl
  }

  readiness(): Readiness {
    const l = this.inst.lifecycle
    if (l.takesRequests) return 'ready'
    switch (l.state) {
      case 'active':
        // Active but not routed to: a sleep drains it (a request wakes it after) or a move holds it.
        return l.operation === 'sleep' ? 'asleep' : 'unavailable'
      case 'sleeping':
        return l.operation === 'wake' ? 'waking' : 'asleep'
      case 'starting':
        return 'starting'
      default:
        return 'unavailable'
    }
  }

  inFlight(): number {
    return this.inst.lifecycle.inFlight
  }

  acquire(): void {
    this.inst.lifecycle.acquire()
  }

  release(): void {
    this.inst.lifecycle.release()
  }

  /**
   * wake: the instance serves again, or can no longer serve (stopping, gone: the request is planned
   * again and meets what it is now). A sleep still under way is waited for first, then the
   * instance's one wake runs (or is joined); a wake that leaves the engine asleep is an error, and
   * so is a load that ends failed (its waiters are told why).
   */
  async wake(trace?: SpanBase | null): Promise<void> {
    const l = this.inst.lifecycle
    for (;;) {
      if (l.takesRequests) return
      if (l.state === 'starting') {
        // A catalogued model's load: the request waits for it (only such requests are held here).
        await l.waitUntil((x) => x.state !== 'starting', { what: `the load of ${this.id}` })
        if (this.inst.status === 'failed')
          throw new Error(`the load of ${this.id} failed: ${this.inst.row.error ?? 'no reason given'}`)
        continue
      }
      if (l.state !== 'sleeping' && !(l.state === 'active' && l.operation === 'sleep')) return
      if (l.state === 'sleeping' && (l.operation === null || l.operation === 'wake')) {
        const woke = await this.control.wake(this.inst, trace)
        if (woke.status === 'sleeping') throw new Error('the engine still reports sleeping after waking up')
        return
      }
      // Falling asleep, or a move holds it: its next change is the next step.
      const op = l.operation
      const state = l.state
      await l.waitUntil((x) => x.operation !== op || x.state !== state, { what: `instance ${this.id}` })
    }
  }

  queue() {
    return this.control.queue(this.inst)
  }

  abandoned(): boolean {
    return this.control.abandoned(this.inst)
  }

  phase(): string | null {
    const l = this.inst.lifecycle
    if (l.state === 'starting') return `loading, ${Math.max(0, this.inst.lastProgress)}% done`
    if (l.operation === 'wake') return 'waking up'
    return null
  }

  sleepState(): SleepState | null {
    const l = this.inst.lifecycle
    const r = this.inst.row
    const op = l.operation === 'sleep' || l.operation === 'wake' ? l.operation : null
    if (l.state === 'sleeping')
      return {
        status: op === 'wake' ? 'waking' : 'sleeping',
        since: r.slept_at ? Date.parse(r.slept_at) : null,
        level: r.sleep_level === 1 || r.sleep_level === 2 ? r.sleep_level : null,
        operation: op,
      }
    if (l.state === 'active') return { status: 'active', since: null, level: null, operation: op }
    return null
  }

  sleepable(): boolean {
    return this.inst.row.enable_sleep_mode
  }

  /** contextTokens: max_model_len as the engine settled on it (or as it was asked for). */
  contextTokens(): number | null {
    return this.inst.row.max_tokens ?? null
  }

  async sleep(level: 1 | 2, cancel: AbortSignal, why?: SleepReason): Promise<void> {
    await this.control.sleep(this.inst, level, { signal: cancel, ...(why ? { why } : {}) })
  }

  pinned(): boolean {
    return this.control.pinned(this.inst)
  }

  health(timeoutMs: number, signal: AbortSignal) {
    return this.inst.client.probe({ timeoutMs, signal, asleep: this.inst.status === 'sleeping' })
  }

  address() {
    const url = new URL(this.inst.baseUrl)
    return { host: url.hostname.replace(/^\[|\]$/g, ''), port: Number(url.port) || this.inst.row.port }
  }

  created(): number {
    const r = this.inst.row
    return Math.floor(Date.parse(r.ready_at ?? r.loaded_at) / 1000)
  }
}
