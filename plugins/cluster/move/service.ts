import { randomBytes } from 'node:crypto'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { AppError, badRequest, modelNotFound, notFound } from '../../../src/http/errors.ts'
import { type GatewayPodApi, moveFit } from '../../gateway/api.ts'
import type { Leadership } from '../coordination/types.ts'
import type { PeerCalls } from '../peer-client.ts'
import { peerFailure } from '../remote/service.ts'
import type { Pod } from '../schemas.ts'
import { CrossPodMove } from './cross-pod.ts'
import { MoveDirectory } from './directory.ts'
import type { MoveTimeouts } from './links.ts'
import { MoveLock } from './lock.ts'
import { MovePod, type StandbyCluster } from './pod-side.ts'
import type { ActiveMoves, ClusterMoveRecord, ClusterMoveRequest, StartRequest } from './schemas.ts'

/** MoveCluster: what cluster moves read of the cluster (ClusterService). */
export interface MoveCluster extends StandbyCluster {
  lead(): Leadership
  pods(): Pod[]
  ownerOf(instanceId: string): { podId: string; address: string; local: boolean } | null
  peerAddress(podId: string): string | undefined
}

export interface ClusterMovesDeps {
  cluster: MoveCluster
  gateway: GatewayPodApi
  peers: PeerCalls
  bus: EventBus
  log: Logger
  /** plugins.cluster.request_timeout_ms, and any of the other deadlines to override (tests). */
  timeouts: Pick<MoveTimeouts, 'requestMs'> & Partial<MoveTimeouts>
}

/**
 * The deadlines a move sets itself: every pod's table following a switch (events carry it in
 * milliseconds; 10 s means a pod is not hearing its leader), an unload (SIGTERM grace and SIGKILL),
 * and the silence after which the target's stream counts as a pod gone (its heartbeats come every 15 s).
 */
const DEFAULT_TIMEOUTS = { tableMs: 10_000, unloadMs: 120_000, idleMs: 45_000 }

/** How many finished moves across pods a pod keeps for late readers of their events. */
const KEEP_FINISHED = 50

/**
 * ClusterMoves: the cluster's `POST /api/cluster/models/:instanceId/move`. The move runs on the pod
 * that holds the instance (any pod forwards the request there): without `targetPodId`, or with the
 * owning pod's, it is that pod's own single-pod move (plugins/gateway/move); with another pod it is a
 * CrossPodMove. Either way the leader's MoveLock is taken first (one move at a time, cluster-wide) and
 * let go when the move ends. Its events and its cancel are reached from any pod (MoveDirectory).
 */
export class ClusterMoves {
  readonly local: MovePod
  readonly lock: MoveLock
  readonly directory: MoveDirectory
  private readonly moves = new Map<string, CrossPodMove>()
  /** Holds of the moves this pod runs (a cross-pod move's id, or the hold of a single-pod one). */
  private readonly holds = new Set<string>()
  private readonly running = new Set<Promise<void>>()
  readonly timeouts: MoveTimeouts

  constructor(private readonly d: ClusterMovesDeps) {
    this.timeouts = { ...DEFAULT_TIMEOUTS, ...d.timeouts }
    this.local = new MovePod(d.gateway, d.cluster, d.bus, d.log)
    this.lock = new MoveLock(d.cluster, () => this.activity())
    this.directory = new MoveDirectory(d.cluster, d.peers, d.gateway, this.moves, this.timeouts.requestMs)
  }

  get podId(): string {
    return this.d.cluster.podId
  }

  /** start: the API's move, run on the pod that holds the instance (asked over one signed hop). */
  async start(instanceId: string, body: ClusterMoveRequest): Promise<ClusterMoveRecord> {
    if (this.d.gateway.get(instanceId)) return this.startHere({ instanceId, ...body })
    const owner = this.d.cluster.ownerOf(instanceId)
    if (!owner) throw modelNotFound(instanceId)
    const pod = { podId: owner.podId, address: owner.address }
    try {
      const rec = await this.d.peers.request<ClusterMoveRecord>(
        pod,
        'POST',
        '/internal/moves',
        { instanceId, ...body },
        // Validation asks the leader (which asks every pod) and the target pod's nvidia-smi.
        { timeoutMs: this.timeouts.requestMs * 3 },
      )
      return rec
    } catch (err) {
      throw peerFailure(pod, err)
    }
  }

  /** startHere: the move of an instance this pod holds (404 MODEL_NOT_FOUND otherwise: no second hop). */
  async startHere(req: StartRequest): Promise<ClusterMoveRecord> {
    const source = this.d.gateway.get(req.instanceId)
    if (!source) throw modelNotFound(req.instanceId)
    const drainMs = req.drainTimeoutMs ?? 60000
    if (req.targetPodId === undefined || req.targetPodId === this.podId) return this.startOnPod(req, drainMs)
    const targetPodId = req.targetPodId
    const address = this.d.cluster.peerAddress(targetPodId)
    if (!address) throw notFound(`No pod '${targetPodId}' in the cluster`, 'POD_NOT_FOUND')
    if (this.d.cluster.pods().find((p) => p.podId === targetPodId)?.status !== 'healthy')
      throw new AppError(503, 'POD_UNHEALTHY', `Pod '${targetPodId}' has not been heard from lately`)
    if (source.status !== 'active' && source.status !== 'sleeping')
      throw badRequest(
        `Instance ${source.id} is ${source.status}; only a running or sleeping instance can move`,
      )
    const gpus = [...new Set(req.targetGpuIds)].sort((a, b) => a - b)
    if (gpus.length !== req.targetGpuIds.length) throw badRequest('targetGpuIds must not repeat a GPU')
    if (gpus.length !== source.tensor_parallel_size)
      throw badRequest(
        `targetGpuIds has ${gpus.length} GPU(s) but the instance uses tensor_parallel_size ${source.tensor_parallel_size}`,
      )
    // The source's move runs from here: its sleep, wake, unload or another move gets 409.
    this.d.gateway.beginMove(source.id)
    const move = new CrossPodMove(
      {
        ...this.d,
        timeouts: this.timeouts,
        podId: this.podId,
        local: this.local,
        pods: () => this.d.cluster.pods(),
      },
      {
        move_id: `mv-${randomBytes(4).toString('hex')}`,
        instance_id: source.id,
        target_instance_id: null,
        source_gpu_ids: [...source.gpu_ids].sort((a, b) => a - b),
        target_gpu_ids: gpus,
        drain_timeout_ms: drainMs,
        phase: 'validating',
        message: 'checking the move',
        progress: null,
        error: null,
        started_at: new Date().toISOString(),
        finished_at: null,
        podId: this.podId,
        targetPodId,
      },
      source,
      address,
    )
    const id = move.record.move_id
    this.moves.set(id, move)
    this.holds.add(id)
    try {
      await this.acquire(id)
      await move.validate(moveFit(source))
    } catch (err) {
      this.moves.delete(id)
      this.holds.delete(id)
      this.d.gateway.endMove(source.id)
      this.releaseHold(id)
      throw err
    }
    this.prune()
    const record = { ...move.record }
    this.track(move.run().finally(() => this.finish(id)))
    return record
  }

  /** startOnPod: the owning pod's own single-pod move, under the cluster's lock. */
  private async startOnPod(req: StartRequest, drainMs: number): Promise<ClusterMoveRecord> {
    const hold = `hold-${randomBytes(4).toString('hex')}`
    this.holds.add(hold)
    let record: ClusterMoveRecord
    try {
      await this.acquire(hold)
      const r = await this.d.gateway.moves.start(req.instanceId, req.targetGpuIds, drainMs)
      record = { ...r, podId: this.podId, targetPodId: this.podId }
    } catch (err) {
      this.finish(hold)
      throw err
    }
    const off = this.d.gateway.moves.subscribe(
      record.move_id,
      () => {},
      () => this.finish(hold),
    )
    if (!off) this.finish(hold)
    return record
  }

  /** active: what this pod runs, for the leader's lock. */
  active(): ActiveMoves {
    return { podId: this.podId, holds: [...this.holds], gatewayMove: this.d.gateway.moves.inProgress }
  }

  /** activity: as leader, what every healthy pod runs (a pod that cannot be reached is left out). */
  private async activity(): Promise<ActiveMoves[]> {
    const pods = this.d.cluster.pods().filter((p) => p.status === 'healthy' && p.podId !== this.podId)
    const answers = await Promise.allSettled(
      pods.map((p) => this.d.peers.request<ActiveMoves>(p, 'GET', '/internal/moves/active')),
    )
    const out = [this.active()]
    for (const [i, a] of answers.entries()) {
      if (a.status === 'fulfilled') out.push(a.value)
      else
        this.d.log.warn('move lock: a pod did not say what it runs', {
          pod: pods[i]!.podId,
          error: String(a.reason),
        })
    }
    return out
  }

  /** acquire: the leader's hold for a move this pod runs (409 MOVE_IN_PROGRESS, 503 NO_LEADER). */
  private async acquire(holdId: string): Promise<void> {
    const lead = this.d.cluster.lead()
    if (lead.isLeader) return this.lock.acquire({ holdId, podId: this.podId })
    const address = lead.leaderId ? (lead.leaderAddress ?? this.d.cluster.peerAddress(lead.leaderId)) : null
    if (!lead.leaderId || !address)
      throw new AppError(
        503,
        'NO_LEADER',
        'No leader to serialise moves across the cluster; retry once one leads',
      )
    const leader = { podId: lead.leaderId, address }
    try {
      await this.d.peers.request(
        leader,
        'POST',
        '/internal/moves/lock',
        { holdId, podId: this.podId },
        {
          timeoutMs: this.timeouts.requestMs * 2,
        },
      )
    } catch (err) {
      if (err instanceof AppError && err.code === 'NOT_LEADER')
        throw new AppError(503, 'NO_LEADER', `Pod ${lead.leaderId} no longer leads; retry`)
      throw peerFailure(leader, err)
    }
  }

  /** releaseHold lets the leader's hold go; a lost answer is harmless (the leader frees a stale hold). */
  private releaseHold(holdId: string): void {
    const lead = this.d.cluster.lead()
    if (lead.isLeader) {
      this.lock.release(holdId)
      return
    }
    const address = lead.leaderId ? (lead.leaderAddress ?? this.d.cluster.peerAddress(lead.leaderId)) : null
    if (!lead.leaderId || !address) return
    this.track(
      this.d.peers
        .request({ podId: lead.leaderId, address }, 'POST', '/internal/moves/unlock', {
          holdId,
          podId: this.podId,
        })
        .then(() => {})
        .catch((err) => this.d.log.warn('move lock: unlock failed', { hold: holdId, error: String(err) })),
    )
  }

  private finish(holdId: string): void {
    if (!this.holds.delete(holdId)) return
    this.releaseHold(holdId)
  }

  /** cancelLocal: a cancel of a move this pod runs (404 when it runs none by that id). */
  cancelLocal(moveId: string, force: boolean): void {
    const move = this.moves.get(moveId)
    if (move) move.cancel(force)
    else if (this.d.gateway.moves.get(moveId)) this.d.gateway.moves.cancel(moveId, force)
    else throw notFound(`No move with id '${moveId}'`, 'MOVE_NOT_FOUND')
  }

  /** stop cancels a move still running here (it rolls back) and waits for it, within the deadline. */
  async stop(deadline: AbortSignal): Promise<void> {
    for (const m of this.moves.values()) {
      try {
        if (!m.finished) m.cancel(false)
      } catch {
        // Completing: it finishes on its own.
      }
    }
    await Promise.race([
      Promise.allSettled([...this.running]),
      new Promise((r) => deadline.addEventListener('abort', r, { once: true })),
    ])
  }

  private track(p: Promise<void>): void {
    this.running.add(p)
    void p.catch((err) => this.d.log.error('move failed unexpectedly', { error: String(err) }))
    void p.finally(() => this.running.delete(p))
  }

  private prune(): void {
    const done = [...this.moves.values()].filter((m) => m.finished)
    for (const m of done.slice(0, Math.max(0, done.length - KEEP_FINISHED)))
      this.moves.delete(m.record.move_id)
  }
}
