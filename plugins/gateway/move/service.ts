import { randomBytes } from 'node:crypto'
import { removeFlag } from '../../../src/engine/argv.ts'
import type { GpuSnapshot } from '../../../src/gpu/smi.ts'
import { WaitError } from '../../../src/host/abortable.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import { ReplayHub } from '../../../src/host/hub.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { NOOP_SPAN, PhaseSpans, type SpanBase, type TraceSpan } from '../../../src/host/telemetry/spans.ts'
import { Telemetry } from '../../../src/host/telemetry/telemetry.ts'
import { AppError, badRequest, conflict, insufficientMemory, notFound } from '../../../src/http/errors.ts'
import {
  type LoadRequest,
  type LoadResponse,
  type MoveEvent,
  type MoveFit,
  type MovePhase,
  type MoveRecord,
  moveFit,
} from '../api.ts'
import type { ManagedInstance } from '../instance.ts'
import type { Operation } from '../lifecycle.ts'
import { effectiveFreeMib } from '../placement.ts'

/**
 * MoveManager runs blue-green moves of an instance to other GPUs: load a target beside the source,
 * switch routing to it, drain the source's in-flight requests, unload the source. Any failure rolls
 * back (source routable and unchanged, target unloaded). One move at a time, system-wide. Cancel is
 * decided synchronously against the current phase and reaches the running move through its
 * AbortSignal, so a cancel and the move's own next step can never both act.
 */
export type { MoveEvent, MovePhase, MoveRecord }

/** MoveHost: what a move drives, and only that (the gateway's service implements it). */
export interface MoveHost {
  require(id: string): ManagedInstance
  load(
    req: LoadRequest,
    opts: { routing: boolean; operation: Operation; trace?: SpanBase | null },
  ): Promise<LoadResponse>
  unload(id: string): Promise<void>
  gpuSnapshot(): Promise<GpuSnapshot>
  pendingMibByGpu(snapshot: GpuSnapshot): Map<number, number>
  stopBudgetMs(): number
}

declare module '../../../src/host/bus.ts' {
  interface BusEvents {
    'gateway.move.progress': MoveEvent
  }
}

class Cancelled extends Error {
  constructor(readonly force: boolean) {
    super('cancelled')
  }
}

interface Move {
  record: MoveRecord
  /** target is set as soon as the target instance exists, so a rollback always finds it. */
  target: ManagedInstance | null
  controller: AbortController
  cancel: { force: boolean } | null
  /** progress: the move's events; a late subscriber gets the current phase, then the rest live. */
  progress: ReplayHub<MoveEvent>
  /** span: the move's trace; each phase is a child (`phases`), the target's load under `move.spawning`. */
  span: TraceSpan
  phases: PhaseSpans
}

const FINISHED: ReadonlySet<MovePhase> = new Set(['completed', 'failed'])
const TOO_LATE: ReadonlySet<MovePhase> = new Set(['completing', 'completed', 'failed'])
const KEEP_FINISHED = 50

export class MoveManager {
  private readonly moves = new Map<string, Move>()
  private current: Move | null = null

  constructor(
    private readonly service: MoveHost,
    private readonly bus: EventBus,
    private readonly log: Logger,
    private readonly telemetry: Telemetry = Telemetry.OFF,
  ) {}

  get inProgress(): boolean {
    return this.current !== null
  }

  get(moveId: string): MoveRecord | undefined {
    return this.moves.get(moveId)?.record
  }

  /** start validates synchronously what it can, then runs the move in the background. */
  async start(instanceId: string, targetGpuIds: number[], drainTimeoutMs: number): Promise<MoveRecord> {
    const source = this.service.require(instanceId)
    if (this.current)
      throw conflict(`Another move is in progress (${this.current.record.move_id})`, 'MOVE_IN_PROGRESS')
    if (source.status !== 'active' && source.status !== 'sleeping')
      throw badRequest(
        `Instance ${instanceId} is ${source.status}; only a running or sleeping instance can move`,
      )
    // The source's move runs from here: another sleep, wake, unload or move of it gets 409.
    source.lifecycle.begin('move')
    const target = [...new Set(targetGpuIds)].sort((a, b) => a - b)
    const current = [...source.row.gpu_ids].sort((a, b) => a - b)
    try {
      if (target.length !== targetGpuIds.length) throw badRequest('target_gpu_ids must not repeat a GPU')
      if (target.join(',') === current.join(','))
        throw badRequest(`target_gpu_ids must differ from the source's GPUs (${current.join(', ')})`)
      if (target.length !== source.row.tensor_parallel_size)
        throw badRequest(
          `target_gpu_ids has ${target.length} GPU(s) but the instance uses tensor_parallel_size ${source.row.tensor_parallel_size}`,
        )
    } catch (err) {
      source.lifecycle.end('move')
      throw err
    }
    const move: Move = {
      record: {
        move_id: `mv-${randomBytes(4).toString('hex')}`,
        instance_id: instanceId,
        target_instance_id: null,
        source_gpu_ids: current,
        target_gpu_ids: target,
        drain_timeout_ms: drainTimeoutMs,
        phase: 'validating',
        message: 'checking the target GPUs',
        progress: null,
        error: null,
        started_at: new Date().toISOString(),
        finished_at: null,
      },
      target: null,
      controller: new AbortController(),
      cancel: null,
      progress: new ReplayHub<MoveEvent>({ snapshot: () => [this.event(move)] }),
      span: NOOP_SPAN,
      phases: new PhaseSpans(NOOP_SPAN),
    }
    move.span = this.telemetry.operation('gateway.move', {
      'modelgate.move_id': move.record.move_id,
      'modelgate.instance_id': instanceId,
      'gen_ai.request.model': source.row.served_model_name,
      'modelgate.source_gpu_ids': current.join(','),
      'modelgate.target_gpu_ids': target.join(','),
    })
    move.phases = new PhaseSpans(move.span)
    this.current = move
    this.moves.set(move.record.move_id, move)
    this.emit(move, 'validating', move.record.message)
    try {
      await this.checkFits(moveFit(source.row), target)
    } catch (err) {
      this.moves.delete(move.record.move_id)
      this.current = null
      source.lifecycle.end('move')
      move.phases.end()
      move.span.end(err instanceof Error ? err.message : String(err))
      throw err
    }
    this.prune()
    const record = { ...move.record }
    void this.run(move, source).catch((err) =>
      this.log.error('move failed unexpectedly', { error: String(err) }),
    )
    return record
  }

  /**
   * checkFits: the target GPUs exist and have room for what the instance `fit` describes (its
   * measured footprint, or its engine's share of each GPU when larger). A move across pods asks the
   * target pod with the source pod's figures (moveFit of the source's record).
   */
  async checkFits(fit: MoveFit, target: number[]): Promise<void> {
    const snap = await this.service.gpuSnapshot()
    if (!snap.available)
      throw new AppError(503, 'GPU_PROBE_UNAVAILABLE', `No GPU probe available: ${snap.reason}`)
    const byIndex = new Map(snap.gpus.map((g) => [g.index, g]))
    const missing = target.filter((g) => !byIndex.has(g))
    if (missing.length) throw badRequest(`GPU ${missing.join(', ')} does not exist`)
    const pending = this.service.pendingMibByGpu(snap)
    const footprintGib = fit.footprint_gib
    if (footprintGib === null)
      throw badRequest(
        `No memory measurement for ${fit.instance_id} (no memory_baseline_by_gpu or memory metrics); cannot check the target fits`,
      )
    for (const idx of target) {
      const g = byIndex.get(idx)!
      const freeGib = effectiveFreeMib(g, pending) / 1024
      const total = g.memoryTotalMib ? g.memoryTotalMib / 1024 : null
      const engineNeeds = fit.sharedcache_enabled || total === null ? 0 : fit.gpu_memory_utilization * total
      const need = Math.max(footprintGib, engineNeeds)
      if (freeGib < need)
        throw insufficientMemory(
          `GPU ${idx} has ${freeGib.toFixed(2)} GiB free; moving ${fit.instance_id} needs ${need.toFixed(2)} GiB per GPU`,
        )
    }
  }

  private emit(move: Move, phase: MovePhase, message: string, extra: Partial<MoveEvent> = {}): void {
    const r = move.record
    r.phase = phase
    r.message = message
    r.progress = phase === 'spawning' ? (extra.progress ?? r.progress ?? 0) : null
    r.error = extra.error ?? null
    if (FINISHED.has(phase)) r.finished_at = new Date().toISOString()
    const event = this.event(move)
    move.progress.publish(event)
    this.bus.emit('gateway.move.progress', event)
    this.log.info(`move ${r.move_id}: ${phase}`, { message })
    if (FINISHED.has(phase)) {
      move.phases.end()
      move.span.setAttributes({
        'modelgate.outcome': phase,
        'modelgate.target_instance_id': r.target_instance_id ?? undefined,
      })
      move.span.end(phase === 'failed' ? (r.error ?? message) : undefined)
      move.progress.end()
    } else move.phases.enter(`move.${phase}`)
  }

  private event(move: Move): MoveEvent {
    const { move_id, phase, message, progress, error } = move.record
    return { move_id, phase, message, progress, error }
  }

  /**
   * subscribe sends the current state first, then each phase; `onEnd` runs once the move has
   * completed or failed. Returns the unsubscribe function, or null when the move is unknown.
   */
  subscribe(moveId: string, fn: (e: MoveEvent) => void, onEnd: () => void): (() => void) | null {
    const move = this.moves.get(moveId)
    if (!move) return null
    return move.progress.subscribe(fn, { onEnd })
  }

  /** cancel: 404 unknown, 409 completing/completed/failed, else 204. */
  cancel(moveId: string, force: boolean): void {
    const move = this.moves.get(moveId)
    if (!move) throw notFound(`No move with id '${moveId}'`, 'MOVE_NOT_FOUND')
    const phase = move.record.phase
    if (TOO_LATE.has(phase)) {
      const why =
        phase === 'completing' ? 'it is already completing (too late to cancel)' : `it already ${phase}`
      throw conflict(`Move ${moveId} cannot be cancelled: ${why}`, 'MOVE_NOT_CANCELLABLE')
    }
    if (move.cancel) return
    move.cancel = { force }
    move.controller.abort(new Cancelled(force))
  }

  private checkCancel(move: Move): void {
    if (move.cancel) throw new Cancelled(move.cancel.force)
  }

  private async run(move: Move, source: ManagedInstance): Promise<void> {
    try {
      this.checkCancel(move)
      const target = await this.spawn(move, source)
      this.checkCancel(move)
      // switching: from here new requests go to the target only.
      this.emit(move, 'switching', `routing ${source.row.served_model_name} to ${target.id}`)
      // Switch only to a target that answers now; a cancel may land while we ask.
      if (!(await target.client.health(5000)))
        throw new Error(`target ${target.id} stopped answering /health`)
      this.checkCancel(move)
      target.lifecycle.route(true)
      source.lifecycle.route(false)
      this.emit(move, 'draining', `waiting for ${source.inFlight} in-flight request(s) on the source`)
      await this.drain(move, source)
      await this.complete(move, source, target, 'moved')
    } catch (err) {
      const cancelled = err instanceof Cancelled ? err : move.cancel ? new Cancelled(move.cancel.force) : null
      const phase = move.record.phase
      const target = move.target
      if (phase === 'completing') {
        // The target already serves alone: never unload it; report the failed clean-up instead.
        this.emit(move, 'failed', `the target serves; unloading the source failed`, {
          error: (err as Error).message,
        })
        return
      }
      if (cancelled?.force && target && (phase === 'switching' || phase === 'draining')) {
        await this.complete(move, source, target, 'forced to complete by cancel(force=true)').catch(
          (e: Error) =>
            this.emit(move, 'failed', 'the target serves; unloading the source failed', { error: e.message }),
        )
        return
      }
      await this.rollback(move, source, target, cancelled ? 'cancelled' : (err as Error).message)
    } finally {
      if (this.current === move) this.current = null
    }
  }

  private async spawn(move: Move, source: ManagedInstance): Promise<ManagedInstance> {
    const r = source.row
    this.emit(move, 'spawning', `loading ${r.model_path} on GPU ${move.record.target_gpu_ids.join(', ')}`, {
      progress: 0,
    })
    const res = await this.service.load(
      {
        model_path: r.model_path,
        served_model_name: r.served_model_name,
        // The target runs the engine the source runs.
        engine_kind: r.engine_kind,
        ...(r.requested_max_tokens ? { max_tokens: r.requested_max_tokens } : {}),
        gpu_ids: move.record.target_gpu_ids,
        tensor_parallel_size: r.tensor_parallel_size,
        gpu_memory_utilization: r.gpu_memory_utilization,
        enable_sleep_mode: r.enable_sleep_mode,
        evictable: r.evictable,
        // The source holds its port: a fixed --port would make the target collide with it.
        extra_args: removeFlag(r.extra_args, '--port'),
        force: true,
      },
      { routing: false, operation: 'move', trace: move.span },
    )
    const target = this.service.require(res.instance_id)
    move.target = target
    move.record.target_instance_id = target.id
    const stopProgress = target.events.subscribe(
      new Set(['progress']),
      true,
      (e) => {
        const percent = Number(e.data.percent ?? 0)
        if (move.record.phase === 'spawning' && percent !== move.record.progress)
          this.emit(move, 'spawning', `target ${target.id}: ${String(e.data.phase)}`, { progress: percent })
      },
      () => {},
    )
    try {
      await target.lifecycle.waitUntil((l) => l.state !== 'starting', {
        signal: move.controller.signal,
        what: `the start of the target ${target.id}`,
      })
    } finally {
      stopProgress()
    }
    if (target.status !== 'active')
      throw new Error(`target failed to start: ${target.row.error ?? target.status}`)
    return target
  }

  private async drain(move: Move, source: ManagedInstance): Promise<void> {
    try {
      await source.lifecycle.drained({
        signal: move.controller.signal,
        timeoutMs: move.record.drain_timeout_ms,
      })
    } catch (err) {
      if (!(err instanceof WaitError && err.kind === 'timeout')) throw err
      this.log.warn(
        `move ${move.record.move_id}: drain timeout with ${source.inFlight} request(s) still open`,
      )
    }
  }

  private async complete(
    move: Move,
    source: ManagedInstance,
    target: ManagedInstance,
    why: string,
  ): Promise<void> {
    target.lifecycle.route(true)
    source.lifecycle.route(false)
    this.emit(move, 'completing', `unloading the source ${source.id} (${why})`)
    target.lifecycle.end('move')
    source.lifecycle.end('move')
    await this.unloadAndWait(source)
    this.emit(
      move,
      'completed',
      `${source.row.served_model_name} now served by ${target.id} on GPU ${target.row.gpu_ids.join(', ')}`,
    )
  }

  private async rollback(
    move: Move,
    source: ManagedInstance,
    target: ManagedInstance | null,
    reason: string,
  ) {
    // The source serves again, unless its engine died meanwhile (then it stays failed).
    const s = source.lifecycle
    if (s.state === 'active' || s.state === 'sleeping') s.route(true)
    s.end('move')
    if (target) {
      target.lifecycle.route(false)
      if (target.lifecycle.operation === 'move') target.lifecycle.end('move')
      await this.unloadAndWait(target).catch((err) =>
        this.log.error('rollback unload failed', { error: String(err) }),
      )
    }
    this.emit(move, 'failed', `rolled back: ${source.id} keeps serving`, { error: reason })
  }

  /** unloadAndWait unloads and waits until the instance is gone, within the engine's stop budget. */
  private async unloadAndWait(inst: ManagedInstance): Promise<void> {
    if (inst.lifecycle.state === 'removed') return
    await this.service.unload(inst.id)
    await inst.lifecycle.waitUntil((l) => l.state === 'removed', {
      timeoutMs: this.service.stopBudgetMs(),
      what: `the unload of ${inst.id}`,
    })
  }

  private prune(): void {
    const finished = [...this.moves.values()].filter((m) => FINISHED.has(m.record.phase))
    for (const m of finished.slice(0, Math.max(0, finished.length - KEEP_FINISHED)))
      this.moves.delete(m.record.move_id)
  }
}
