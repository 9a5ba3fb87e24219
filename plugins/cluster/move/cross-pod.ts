import { removeFlag } from '../../../src/engine/argv.ts'
import { WaitError } from '../../../src/host/abortable.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import { ReplayHub } from '../../../src/host/hub.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { conflict } from '../../../src/http/errors.ts'
import type {
  GatewayPodApi,
  InstanceRecord,
  LoadRequest,
  MoveEvent,
  MoveFit,
  MovePhase,
} from '../../gateway/api.ts'
import { type LinkDeps, MoveLinks } from './links.ts'
import type { ClusterMoveRecord, TableWant } from './schemas.ts'

export interface CrossPodDeps extends LinkDeps {
  gateway: GatewayPodApi
  bus: EventBus
  log: Logger
}

declare module '../../../src/host/bus.ts' {
  interface BusEvents {
    /** cluster.move.progress: a move this pod runs across pods went to a phase (as `move_progress`). */
    'cluster.move.progress': MoveEvent
  }
}

class Cancelled extends Error {
  constructor(readonly force: boolean) {
    super('cancelled')
  }
}

const FINISHED: ReadonlySet<MovePhase> = new Set(['completed', 'failed'])
const TOO_LATE: ReadonlySet<MovePhase> = new Set(['completing', 'completed', 'failed'])

/**
 * CrossPodMove: one blue-green move of an instance to another pod, run by the pod that holds the
 * source, with the phases, cancel table and events of the single-pod move (plugins/gateway/move).
 * The switch goes through the routing table, which every pod's /v1 follows:
 *
 * 1. spawning: the target pod loads the source's settings out of routing (its move running) and
 *    reports it `standby`; its load progress is this move's progress.
 * 2. switching: the target takes requests on its pod and enters the table; once every healthy pod's
 *    table lists it, the source leaves the table (still serving whatever still reaches it); once
 *    every table has dropped it, this pod's own /v1 stops sending it requests too.
 * 3. draining: the source's in-flight requests (from any pod's /v1) finish, up to drain_timeout_ms.
 * 4. completing: the target's move ends; the source unloads.
 *
 * Each step waits until every table says what the next one needs, so an edge never routes to an
 * instance that no longer takes requests, and never has no entry at all. A rollback walks back the
 * same way: the source takes requests and rejoins every table before the target leaves them, drains
 * and unloads. `routed`, `withdrawn` and `sourceOff` record what may have happened (set before the
 * call that does it), and every step is idempotent, so a rollback after a lost answer is safe.
 */
export class CrossPodMove {
  readonly progress: ReplayHub<MoveEvent>
  private readonly links: MoveLinks
  private readonly controller = new AbortController()
  private cancelled: Cancelled | null = null
  private target: { instanceId: string; port: number } | null = null
  private routed = false
  private withdrawn = false
  private sourceOff = false

  constructor(
    private readonly d: CrossPodDeps,
    readonly record: ClusterMoveRecord,
    private readonly source: InstanceRecord,
    targetAddress: string,
  ) {
    this.links = new MoveLinks(d, record.move_id, { podId: record.targetPodId, address: targetAddress })
    this.progress = new ReplayHub<MoveEvent>({ snapshot: () => [this.event()] })
  }

  get finished(): boolean {
    return FINISHED.has(this.record.phase)
  }

  /** validate: the target pod has room on the target GPUs for the source's measured footprint. */
  async validate(fit: MoveFit): Promise<void> {
    this.emit(
      'validating',
      `checking GPU ${this.record.target_gpu_ids.join(', ')} on pod ${this.record.targetPodId}`,
    )
    await this.links.step('target/check', { fit, gpuIds: this.record.target_gpu_ids })
  }

  /** cancel (404 is the caller's): 409 once completing, else the running step stops. */
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
    if (phase === 'completing') {
      this.emit('failed', 'the target serves; unloading the source failed', { error: message(err) })
      return
    }
    if (this.cancelled?.force && this.target && (phase === 'switching' || phase === 'draining')) {
      try {
        await this.forceComplete()
        return
      } catch (e) {
        if (this.record.phase === 'completing') {
          this.emit('failed', 'the target serves; unloading the source failed', { error: message(e) })
          return
        }
        err = e
      }
    }
    await this.rollback(this.cancelled ? 'cancelled' : message(err))
  }

  private async spawn(): Promise<void> {
    const r = this.source
    const rec = this.record
    this.emit(
      'spawning',
      `loading ${r.model_path} on pod ${rec.targetPodId} GPU ${rec.target_gpu_ids.join(', ')}`,
      {
        progress: 0,
      },
    )
    const req: LoadRequest = {
      model_path: r.model_path,
      served_model_name: r.served_model_name,
      // The target runs the engine the source runs (a record from an older pod names none: its default).
      ...(r.engine_kind ? { engine_kind: r.engine_kind } : {}),
      ...(r.max_tokens ? { max_tokens: r.max_tokens } : {}),
      gpu_ids: rec.target_gpu_ids,
      tensor_parallel_size: r.tensor_parallel_size,
      gpu_memory_utilization: r.gpu_memory_utilization,
      enable_sleep_mode: r.enable_sleep_mode,
      evictable: r.evictable,
      // The port is the target pod's to choose: a fixed --port may be taken there.
      extra_args: removeFlag(r.extra_args, '--port'),
      force: true,
    }
    const target = await this.links.step<{ instanceId: string; port: number }>('target/load', req)
    this.target = target
    rec.target_instance_id = target.instanceId
    this.checkCancel()
    await this.links.followStart(
      target.instanceId,
      (percent, phase) => {
        if (rec.phase === 'spawning' && percent !== rec.progress)
          this.emit('spawning', `target ${target.instanceId}: ${phase}`, { progress: percent })
      },
      this.controller.signal,
    )
  }

  private async switchOver(): Promise<void> {
    const target = this.target!
    const rec = this.record
    this.emit(
      'switching',
      `routing ${this.source.served_model_name} to ${target.instanceId} on pod ${rec.targetPodId}`,
    )
    this.routed = true
    await this.links.step('target/serve', { instanceId: target.instanceId })
    await this.links.tables(this.targetEntry(true), this.controller.signal)
    this.checkCancel()
    this.withdrawn = true
    this.d.local.withdraw(this.source.id)
    await this.links.tables(this.sourceEntry(false), this.controller.signal)
    this.checkCancel()
    this.sourceOff = true
    this.d.local.stopRouting(this.source.id)
  }

  private async drain(): Promise<void> {
    const gw = this.d.gateway
    const id = this.source.id
    this.emit('draining', `waiting for ${gw.routingOf(id).inFlight} in-flight request(s) on the source`)
    if (this.record.drain_timeout_ms <= 0) return
    try {
      await gw.drained(id, { signal: this.controller.signal, timeoutMs: this.record.drain_timeout_ms })
    } catch (err) {
      if (!(err instanceof WaitError && err.kind === 'timeout')) throw err
      this.d.log.warn(
        `move ${this.record.move_id}: drain timeout with ${gw.routingOf(id).inFlight} request(s) still open`,
      )
    }
  }

  /** forceComplete: cancel(force) in switching or draining: finish the switch, then unload at once. */
  private async forceComplete(): Promise<void> {
    const target = this.target!
    if (!this.routed) {
      this.routed = true
      await this.links.step('target/serve', { instanceId: target.instanceId })
    }
    await this.links.tables(this.targetEntry(true)).catch(() => {})
    this.withdrawn = true
    this.d.local.withdraw(this.source.id)
    await this.links.tables(this.sourceEntry(false)).catch(() => {})
    this.sourceOff = true
    this.d.local.stopRouting(this.source.id)
    await this.complete('forced to complete by cancel(force=true)')
  }

  private async complete(why: string): Promise<void> {
    const target = this.target!
    const source = this.source
    this.emit('completing', `unloading the source ${source.id} (${why})`)
    await this.links.step('target/commit', { instanceId: target.instanceId })
    await this.d.local.release(source.id, 0, this.d.timeouts.unloadMs)
    this.emit(
      'completed',
      `${source.served_model_name} now served by ${target.instanceId} on pod ${this.record.targetPodId} GPU ${this.record.target_gpu_ids.join(', ')}`,
    )
  }

  private async rollback(reason: string): Promise<void> {
    const source = this.source
    const target = this.target
    // The source first: it takes requests and is in every table before the target leaves them.
    try {
      if (this.sourceOff || this.withdrawn) {
        this.d.local.restore(source.id)
        await this.links
          .tables(this.sourceEntry(true))
          .catch((e) => this.warn('the source rejoining the tables', e))
      }
      this.d.local.commit(source.id)
    } catch (err) {
      this.warn('restoring the source', err)
    }
    if (target) {
      try {
        if (this.routed) {
          await this.links.step('target/withdraw', { instanceId: target.instanceId })
          await this.links
            .tables(this.targetEntry(false))
            .catch((e) => this.warn('the target leaving the tables', e))
        }
        const drainMs = this.routed ? this.record.drain_timeout_ms : 0
        await this.links.step(
          'target/release',
          { instanceId: target.instanceId, drainTimeoutMs: drainMs },
          drainMs + this.d.timeouts.unloadMs + this.d.timeouts.requestMs,
        )
      } catch (err) {
        this.warn(`releasing the target on pod ${this.record.targetPodId}`, err)
      }
    }
    this.emit('failed', `rolled back: ${source.id} keeps serving`, { error: reason })
  }

  private sourceEntry(present: boolean): TableWant {
    return { model: this.source.served_model_name, podId: this.d.podId, port: this.source.port, present }
  }

  private targetEntry(present: boolean): TableWant {
    const port = this.target!.port
    return { model: this.source.served_model_name, podId: this.record.targetPodId, port, present }
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
    this.d.bus.emit('cluster.move.progress', event)
    this.d.log.info(`move ${r.move_id}: ${phase}`, { message: text })
    if (FINISHED.has(phase)) this.progress.end()
  }

  private event(): MoveEvent {
    const { move_id, phase, message, progress, error } = this.record
    return { move_id, phase, message, progress, error }
  }
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err)
}
