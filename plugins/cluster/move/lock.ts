import { AppError, conflict } from '../../../src/http/errors.ts'
import type { ActiveMoves, Hold } from './schemas.ts'

/** LockCluster: what the lock reads of the cluster (ClusterService). */
export interface LockCluster {
  lead(): { isLeader: boolean; term: number }
}

/** ActivityProbe: what every healthy pod says it runs (GET /internal/moves/active, or this pod's own). */
export type ActivityProbe = () => Promise<ActiveMoves[]>

/**
 * MoveLock: one move at a time, cluster-wide, held by the leader. A pod that runs a
 * cluster move asks the leader for a hold before anything changes (in the move's validating phase)
 * and lets it go when the move has completed or failed.
 *
 * The leader grants a hold only when (1) it holds none, or the pod holding it no longer reports that
 * hold (its move ended, its unlock was lost, the pod is gone), and (2) no healthy pod reports another
 * move: a cluster move of its own or one its gateway runs (a single-pod move started on that pod's
 * own API). Asking every pod makes the lock survive a leader change: a new leader, which starts with
 * no hold, still sees the move a pod runs. The hold is taken before anything is awaited, so two
 * requests arriving together cannot both be granted.
 */
export class MoveLock {
  private holder: Hold | null = null

  constructor(
    private readonly cluster: LockCluster,
    private readonly activity: ActivityProbe,
  ) {}

  get held(): Hold | null {
    return this.holder
  }

  async acquire(req: Hold): Promise<void> {
    this.mustLead()
    const seen = this.holder
    if (seen && seen.holdId === req.holdId) return
    let reports: ActiveMoves[] | null = null
    if (seen) {
      reports = await this.activity()
      if (reports.some((r) => r.podId === seen.podId && r.holds.includes(seen.holdId)))
        throw busy(`a move on pod ${seen.podId} (${seen.holdId})`)
      // Someone else took it while we asked: theirs stands.
      if (this.holder !== seen) throw busy(`a move on pod ${this.holder?.podId ?? '?'}`)
    }
    this.mustLead()
    this.holder = req
    try {
      reports = await this.activity()
      const other = reports.find((r) => r.gatewayMove || r.holds.some((h) => h !== req.holdId))
      if (other) throw busy(`a move on pod ${other.podId}`)
    } catch (err) {
      if (this.holder === req) this.holder = null
      throw err
    }
  }

  release(holdId: string): void {
    if (this.holder?.holdId === holdId) this.holder = null
  }

  private mustLead(): void {
    if (!this.cluster.lead().isLeader)
      throw new AppError(
        409,
        'NOT_LEADER',
        'This pod does not lead the cluster; ask the leader for the move lock',
      )
  }
}

function busy(what: string): AppError {
  return conflict(`Another move is in progress (${what})`, 'MOVE_IN_PROGRESS')
}
