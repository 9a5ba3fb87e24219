import { randomBytes } from 'node:crypto'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { Telemetry } from '../../../src/host/telemetry/telemetry.ts'
import { badRequest, conflict, notFound } from '../../../src/http/errors.ts'
import {
  type GatewayMoves,
  type MoveEvent,
  type MovePhase,
  type MoveRecord,
  type MoveRequest,
  type MoveTarget,
  moveFit,
} from '../api.ts'
import type { ManagedInstance } from '../instance.ts'
import { LocalSteps, localTarget, type MoveHost } from './local-target.ts'
import { MoveSaga } from './saga.ts'

export type { MoveEvent, MovePhase, MoveRecord }

declare module '../../../src/host/bus.ts' {
  interface BusEvents {
    'gateway.move.progress': MoveEvent
  }
}

const KEEP_FINISHED = 50

/**
 * MoveManager runs this pod's blue-green moves (MoveSaga), one at a time whatever their target: the
 * gateway's own to other GPUs of this pod, and a cluster's to another pod (its MoveTarget). It checks
 * a request before anything changes, keeps the last finished moves for late readers, and answers
 * their events and cancels.
 */
export class MoveManager implements GatewayMoves {
  readonly here: LocalSteps
  private readonly moves = new Map<string, MoveSaga>()
  private current: MoveSaga | null = null

  constructor(
    private readonly host: MoveHost,
    private readonly bus: EventBus,
    private readonly log: Logger,
    private readonly telemetry: Telemetry = Telemetry.OFF,
  ) {
    this.here = new LocalSteps(host, log)
  }

  get inProgress(): boolean {
    return this.current !== null
  }

  get(moveId: string): MoveRecord | undefined {
    return this.moves.get(moveId)?.record
  }

  /** start validates synchronously what it can, then the validating phase, then runs the move in the background. */
  async start(req: MoveRequest): Promise<MoveRecord> {
    const source = this.host.require(req.instanceId)
    if (this.current)
      throw conflict(`Another move is in progress (${this.current.record.move_id})`, 'MOVE_IN_PROGRESS')
    if (source.status !== 'active' && source.status !== 'sleeping')
      throw badRequest(
        `Instance ${source.id} is ${source.status}; only a running or sleeping instance can move`,
      )
    // The source's move runs from here: another sleep, wake, unload or move of it gets 409.
    source.lifecycle.begin('move')
    let saga: MoveSaga
    try {
      saga = this.saga(source, req)
    } catch (err) {
      source.lifecycle.end('move')
      throw err
    }
    const id = saga.record.move_id
    this.current = saga
    this.moves.set(id, saga)
    try {
      await saga.validate(moveFit(source.row), req.admit)
    } catch (err) {
      this.moves.delete(id)
      this.current = null
      source.lifecycle.end('move')
      throw err
    }
    this.prune()
    const record = { ...saga.record }
    void saga
      .run()
      .catch((err) => this.log.error('move failed unexpectedly', { error: String(err) }))
      .finally(() => {
        if (this.current === saga) this.current = null
      })
    return record
  }

  /** saga: the move of `source` the request asks for, its target GPUs checked (400). */
  private saga(source: ManagedInstance, req: MoveRequest): MoveSaga {
    const field = req.field ?? 'target_gpu_ids'
    const gpus = [...new Set(req.targetGpuIds)].sort((a, b) => a - b)
    const current = [...source.row.gpu_ids].sort((a, b) => a - b)
    const tp = source.row.tensor_parallel_size
    const move_id = `mv-${randomBytes(4).toString('hex')}`
    const context = {
      move_id,
      source: source.record(),
      target_gpu_ids: gpus,
      drain_timeout_ms: req.drainTimeoutMs,
    }
    const target: MoveTarget = req.target ? req.target(context) : localTarget(this.here, context)
    if (gpus.length !== req.targetGpuIds.length) throw badRequest(`${field} must not repeat a GPU`)
    if (target.podId === null && gpus.join(',') === current.join(','))
      throw badRequest(`${field} must differ from the source's GPUs (${current.join(', ')})`)
    if (gpus.length !== tp)
      throw badRequest(`${field} has ${gpus.length} GPU(s) but the instance uses tensor_parallel_size ${tp}`)
    const span = this.telemetry.operation('gateway.move', {
      'modelgate.move_id': move_id,
      'modelgate.instance_id': source.id,
      'gen_ai.request.model': source.row.served_model_name,
      'modelgate.source_gpu_ids': current.join(','),
      'modelgate.target_gpu_ids': gpus.join(','),
      'modelgate.target_pod_id': target.podId ?? undefined,
    })
    const record: MoveRecord = {
      move_id,
      instance_id: source.id,
      target_instance_id: null,
      source_gpu_ids: current,
      target_gpu_ids: gpus,
      drain_timeout_ms: req.drainTimeoutMs,
      phase: 'validating',
      message: 'checking the move',
      progress: null,
      error: null,
      started_at: new Date().toISOString(),
      finished_at: null,
    }
    const announce = req.announce ?? ((e: MoveEvent) => this.bus.emit('gateway.move.progress', e))
    return new MoveSaga({ steps: this.here, log: this.log, announce, span }, record, source, target)
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
    move.cancel(force)
  }

  private prune(): void {
    const finished = [...this.moves.values()].filter((m) => m.finished)
    for (const m of finished.slice(0, Math.max(0, finished.length - KEEP_FINISHED)))
      this.moves.delete(m.record.move_id)
  }
}
