import { removeFlag } from '../../../src/engine/argv.ts'
import { WaitError } from '../../../src/host/abortable.ts'
import { ReplayHub } from '../../../src/host/hub.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { PhaseSpans, type TraceSpan } from '../../../src/host/telemetry/spans.ts'
import { conflict } from '../../../src/http/errors.ts'
import type { LoadRequest, MoveEvent, MoveFit, MovePhase, MoveRecord, MoveSteps, MoveTarget } from '../api.ts'
import type { ManagedInstance } from '../instance.ts'

/** Cancelled: the reason a cancel aborts the move's signal with. */
class Cancelled extends Error {
  constructor(readonly force: boolean) {
    super('cancelled')
  }
}

export const FINISHED: ReadonlySet<MovePhase> = new Set(['completed', 'failed'])
/** The cancel table: too late once completing (the source is being unloaded), and once finished. */
const TOO_LATE: ReadonlySet<MovePhase> = new Set(['completing', 'completed', 'failed'])

export interface SagaDeps {
  /** steps: this pod's instance steps, with which the saga releases its source. */
  steps: MoveSteps
  log: Logger
  /** announce: each event, besides the move's own stream (a bus event). */
  announce: (e: MoveEvent) => void
  /** span: the move's trace; each phase is a child, the target's load under `move.spawning`. */
  span: TraceSpan
}

/**
 * MoveSaga: one blue-green move of an instance this pod holds, written once for every kind of
 * target (MoveTarget: GPUs on this pod, or another pod of a cluster):
 *
 * 1. validating: what must allow the move (a cluster's lock), then the target GPUs have room.
 * 2. spawning: the target loads the source's settings out of routing, its move running; its load
 *    progress is this move's progress; the phase ends when it is active.
 * 3. switching: the target takes requests (wherever the model is routed), then this pod stops
 *    routing to the source.
 * 4. draining: the source's in-flight requests finish, up to drain_timeout_ms.
 * 5. completing: the target's move ends; the source unloads. Then completed.
 *
 * Any failure rolls back in reverse: the source is routed to again (everywhere it was withdrawn
 * from) before the target leaves routing, drains and unloads; the move ends `failed` with `error`.
 * The cancel table: validating and spawning roll back; switching and draining roll back, or with
 * force complete at once; completing and after is 409 (too late). A cancel is decided synchronously
 * against the phase and reaches the running step through the move's signal, so a cancel and the
 * move's own next step never both act. `routed` and `sourceOff` record what may have happened (set
 * before the call that does it), so a rollback undoes exactly that.
 */
export class MoveSaga {
  readonly progress: ReplayHub<MoveEvent>
  private readonly controller = new AbortController()
  private cancelled: Cancelled | null = null
  private readonly phases: PhaseSpans
  private routed = false
  private sourceOff = false

  constructor(
    private readonly d: SagaDeps,
    readonly record: MoveRecord,
    private readonly source: ManagedInstance,
    private readonly target: MoveTarget,
  ) {
    this.progress = new ReplayHub<MoveEvent>({ snapshot: () => [this.event()] })
    this.phases = new PhaseSpans(d.span)
  }

  get finished(): boolean {
    return FINISHED.has(this.record.phase)
  }

  /** validate: the validating phase; on a throw the caller forgets the move (it never ran). */
  async validate(fit: MoveFit, admit?: () => Promise<void>): Promise<void> {
    const r = this.record
    const pod = this.target.podId
    this.emit(
      'validating',
      pod ? `checking GPU ${r.target_gpu_ids.join(', ')} on pod ${pod}` : 'checking the target GPUs',
    )
    try {
      await admit?.()
      await this.target.check(fit)
    } catch (err) {
      this.phases.end()
      this.d.span.end(message(err))
      this.progress.end()
      throw err
    }
  }

  /** cancel (404 is the caller's): 409 once too late, else the running step stops. */
  cancel(force: boolean): void {
    const phase = this.record.phase
    if (TOO_LATE.has(phase)) {
      const why =
        phase === 'completing' ? 'it is already completing (too late to cancel)' : `it already ${phase}`
      throw conflict(`Move ${this.record.move_id} cannot be cancelled: ${why}`, 'MOVE_NOT_CANCELLABLE')
    }
    if (this.cancelled) return
    this.cancelled = new Cancelled(force)
    this.controller.abort(this.cancelled)
  }

  async run(): Promise<void> {
    try {
      this.checkCancel()
      await this.spawn()
      this.checkCancel()
      await this.switchOver()
      await this.drain()
      await this.complete('moved')
    } catch (err) {
      await this.recover(err)
    }
  }

  private async recover(err: unknown): Promise<void> {
    const phase = this.record.phase
    if (phase === 'completing') return this.cleanupFailed(err)
    if (
      this.cancelled?.force &&
      this.record.target_instance_id &&
      (phase === 'switching' || phase === 'draining')
    ) {
      try {
        await this.forceComplete()
        return
      } catch (e) {
        if (this.record.phase === 'completing') return this.cleanupFailed(e)
        err = e
      }
    }
    await this.rollback(this.cancelled ? 'cancelled' : message(err))
  }

  /** cleanupFailed: the target serves alone; never unload it, report the failed clean-up instead. */
  private cleanupFailed(err: unknown): void {
    this.emit('failed', 'the target serves; unloading the source failed', { error: message(err) })
  }

  private async spawn(): Promise<void> {
    const r = this.source.row
    const rec = this.record
    this.emit('spawning', `loading ${r.model_path} on ${this.where()}`, { progress: 0 })
    const req: LoadRequest = {
      model_path: r.model_path,
      served_model_name: r.served_model_name,
      // The target runs the engine the source runs.
      engine_kind: r.engine_kind,
      ...(r.requested_max_tokens ? { max_tokens: r.requested_max_tokens } : {}),
      gpu_ids: rec.target_gpu_ids,
      tensor_parallel_size: r.tensor_parallel_size,
      gpu_memory_utilization: r.gpu_memory_utilization,
      enable_sleep_mode: r.enable_sleep_mode,
      evictable: r.evictable,
      // The source holds its port (and another pod's may be taken): the target's port is chosen there.
      extra_args: removeFlag(r.extra_args, '--port'),
      force: true,
    }
    const target = await this.target.load(req, this.d.span)
    rec.target_instance_id = target.instanceId
    this.checkCancel()
    await this.target.ready((percent, phase) => {
      if (rec.phase === 'spawning' && percent !== rec.progress)
        this.emit('spawning', `target ${target.instanceId}: ${phase}`, { progress: percent })
    }, this.controller.signal)
  }

  private async switchOver(): Promise<void> {
    const pod = this.target.podId
    this.emit(
      'switching',
      `routing ${this.source.row.served_model_name} to ${this.record.target_instance_id}${pod ? ` on pod ${pod}` : ''}`,
    )
    this.routed = true
    await this.target.switchTo(this.controller.signal)
    this.checkCancel()
    this.sourceOff = true
    this.source.lifecycle.route(false)
  }

  private async drain(): Promise<void> {
    const l = this.source.lifecycle
    this.emit('draining', `waiting for ${l.inFlight} in-flight request(s) on the source`)
    if (this.record.drain_timeout_ms <= 0) return
    try {
      await l.drained({ signal: this.controller.signal, timeoutMs: this.record.drain_timeout_ms })
    } catch (err) {
      if (!(err instanceof WaitError && err.kind === 'timeout')) throw err
      this.d.log.warn(`move ${this.record.move_id}: drain timeout with ${l.inFlight} request(s) still open`)
    }
  }

  /** forceComplete: cancel(force) in switching or draining: finish the switch, then unload at once. */
  private async forceComplete(): Promise<void> {
    if (!this.sourceOff) {
      this.routed = true
      await this.target.switchTo(null)
      this.sourceOff = true
      this.source.lifecycle.route(false)
    }
    await this.complete('forced to complete by cancel(force=true)')
  }

  private async complete(why: string): Promise<void> {
    const source = this.source
    this.emit('completing', `unloading the source ${source.id} (${why})`)
    await this.target.commit()
    await this.d.steps.release(source.id, 0)
    this.emit(
      'completed',
      `${source.row.served_model_name} now served by ${this.record.target_instance_id} on ${this.where()}`,
    )
  }

  private async rollback(reason: string): Promise<void> {
    const source = this.source
    // The source first: it takes requests everywhere again before the target leaves routing.
    try {
      const s = source.lifecycle
      // Unless its engine died meanwhile (then it stays failed).
      if (s.state === 'active' || s.state === 'sleeping') s.route(true)
      await this.target.restoreSource()
      this.d.steps.commit(source.id)
    } catch (err) {
      this.warn('restoring the source', err)
    }
    try {
      await this.target.release(this.routed ? this.record.drain_timeout_ms : 0)
    } catch (err) {
      this.warn('releasing the target', err)
    }
    this.emit('failed', `rolled back: ${source.id} keeps serving`, { error: reason })
  }

  /** where: the target GPUs as messages name them (with the pod, for another pod's). */
  private where(): string {
    const gpus = `GPU ${this.record.target_gpu_ids.join(', ')}`
    return this.target.podId ? `pod ${this.target.podId} ${gpus}` : gpus
  }

  private checkCancel(): void {
    if (this.cancelled) throw this.cancelled
  }

  private warn(what: string, err: unknown): void {
    this.d.log.warn(`move ${this.record.move_id}: rollback: ${what} failed`, { error: message(err) })
  }

  private emit(phase: MovePhase, text: string, extra: { progress?: number; error?: string } = {}): void {
    const r = this.record
    r.phase = phase
    r.message = text
    r.progress = phase === 'spawning' ? (extra.progress ?? r.progress ?? 0) : null
    r.error = extra.error ?? null
    if (FINISHED.has(phase)) r.finished_at = new Date().toISOString()
    const event = this.event()
    this.progress.publish(event)
    this.d.announce(event)
    this.d.log.info(`move ${r.move_id}: ${phase}`, { message: text })
    if (!FINISHED.has(phase)) {
      this.phases.enter(`move.${phase}`)
      return
    }
    this.phases.end()
    this.d.span.setAttributes({
      'modelgate.outcome': phase,
      'modelgate.target_instance_id': r.target_instance_id ?? undefined,
    })
    this.d.span.end(phase === 'failed' ? (r.error ?? text) : undefined)
    this.progress.end()
  }

  private event(): MoveEvent {
    const { move_id, phase, message, progress, error } = this.record
    return { move_id, phase, message, progress, error }
  }
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err)
}
