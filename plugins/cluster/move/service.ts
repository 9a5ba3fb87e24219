import { randomBytes } from 'node:crypto'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { AppError, modelNotFound, notFound } from '../../../src/http/errors.ts'
import type { GatewayPodApi, MoveContext, MoveEvent, MoveRecord } from '../../gateway/api.ts'
import type { Leadership } from '../coordination/types.ts'
import type { PeerCalls } from '../peer-client.ts'
import { peerFailure } from '../remote/service.ts'
import type { Pod } from '../schemas.ts'
import { MoveDirectory } from './directory.ts'
import type { MoveTimeouts } from './links.ts'
import { MoveLock } from './lock.ts'
import { MovePod, type StandbyCluster } from './pod-side.ts'
import { PodTarget } from './pod-target.ts'
import type { ActiveMoves, ClusterMoveRecord, ClusterMoveRequest, StartRequest } from './schemas.ts'

declare module '../../../src/host/bus.ts' {
  interface BusEvents {
    /** cluster.move.progress: a move this pod runs across pods went to a phase (as `move_progress`). */
    'cluster.move.progress': MoveEvent
  }
}

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

/**
 * ClusterMoves: the cluster's `POST /api/cluster/models/:instanceId/move`. The move runs on the pod
 * that holds the instance (any pod forwards the request there), as that pod's gateway move saga
 * (GatewayMoves): without `targetPodId`, or with the owning pod's, to GPUs of that pod; with another
 * pod, to a PodTarget there. Either way the leader's MoveLock is taken in the validating phase (one
 * move at a time, cluster-wide) and let go when the move ends. Its events and its cancel are reached
 * from any pod (MoveDirectory).
 */
export class ClusterMoves {
  readonly local: MovePod
  readonly lock: MoveLock
  readonly directory: MoveDirectory
  /** The target pod of each move across pods this pod runs (pruned with the gateway's moves). */
  private readonly across = new Map<string, string>()
  /** Holds of the moves this pod runs, one per move. */
  private readonly holds = new Set<string>()
  private readonly running = new Set<Promise<void>>()
  readonly timeouts: MoveTimeouts

  constructor(private readonly d: ClusterMovesDeps) {
    this.timeouts = { ...DEFAULT_TIMEOUTS, ...d.timeouts }
    this.local = new MovePod(d.gateway, d.cluster, d.bus)
    this.lock = new MoveLock(d.cluster, () => this.activity())
    this.directory = new MoveDirectory(
      d.cluster,
      d.peers,
      d.gateway,
      (moveId) => this.across.get(moveId),
      this.timeouts.requestMs,
    )
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
    if (!this.d.gateway.get(req.instanceId)) throw modelNotFound(req.instanceId)
    const targetPodId = req.targetPodId ?? this.podId
    const target = targetPodId === this.podId ? undefined : this.podTarget(targetPodId)
    const hold = `hold-${randomBytes(4).toString('hex')}`
    this.holds.add(hold)
    let record: MoveRecord
    try {
      record = await this.d.gateway.moves.start({
        instanceId: req.instanceId,
        targetGpuIds: req.targetGpuIds,
        drainTimeoutMs: req.drainTimeoutMs ?? 60000,
        field: 'targetGpuIds',
        admit: () => this.acquire(hold),
        ...(target
          ? { target, announce: (e: MoveEvent) => this.d.bus.emit('cluster.move.progress', e) }
          : {}),
      })
    } catch (err) {
      this.finish(hold)
      throw err
    }
    if (target) {
      for (const id of this.across.keys()) if (!this.d.gateway.moves.get(id)) this.across.delete(id)
      this.across.set(record.move_id, targetPodId)
    }
    const ended = new Promise<void>((resolve) => {
      const off = this.d.gateway.moves.subscribe(record.move_id, () => {}, resolve)
      if (!off) resolve()
    }).finally(() => this.finish(hold))
    // Shutdown waits for a move across pods to roll back (it needs the peers); one on this pod ends with its gateway.
    if (target) this.track(ended)
    return { ...record, podId: this.podId, targetPodId }
  }

  /** podTarget: the target of a move to another pod (404 POD_NOT_FOUND, 503 POD_UNHEALTHY). */
  private podTarget(podId: string): (move: MoveContext) => PodTarget {
    const address = this.d.cluster.peerAddress(podId)
    if (!address) throw notFound(`No pod '${podId}' in the cluster`, 'POD_NOT_FOUND')
    if (this.d.cluster.pods().find((p) => p.podId === podId)?.status !== 'healthy')
      throw new AppError(503, 'POD_UNHEALTHY', `Pod '${podId}' has not been heard from lately`)
    const deps = {
      ...this.d,
      timeouts: this.timeouts,
      podId: this.podId,
      local: this.local,
      pods: () => this.d.cluster.pods(),
    }
    return (move) => new PodTarget(deps, move, { podId, address })
  }

  /** active: what this pod runs, for the leader's lock. */
  active(): ActiveMoves {
    // The gateway's move while this pod holds a hold is that hold's move (one move at a time per pod):
    // only a move of the gateway's own API, which no hold covers, is reported as `gatewayMove`.
    const gatewayMove = this.holds.size === 0 && this.d.gateway.moves.inProgress
    return { podId: this.podId, holds: [...this.holds], gatewayMove }
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
    this.d.gateway.moves.cancel(moveId, force)
  }

  /** stop cancels a move across pods still running here (it rolls back) and waits for it, within the deadline. */
  async stop(deadline: AbortSignal): Promise<void> {
    for (const id of this.across.keys()) {
      try {
        this.d.gateway.moves.cancel(id, false)
      } catch {
        // Completing: it finishes on its own; finished or forgotten: nothing to do.
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
}
