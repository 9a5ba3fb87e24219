import { type ClusterConfig, staticLeaderProblems } from '../config.ts'
import type { Coordinator, CoordinatorChange, CoordinatorOptions, Leadership, Peer } from './types.ts'

/**
 * StaticCoordinator: peers and the leader named in YAML, for two hosts and no coordination service.
 * The term is always 1 and there is no failover: with the leader down the cluster is `degraded` and
 * cluster-wide operations wait for it (the leader is still named; the health view says it is silent).
 */
export class StaticCoordinator implements Coordinator {
  readonly kind = 'static'
  private readonly list: Peer[]

  constructor(
    private readonly cfg: NonNullable<ClusterConfig['coordination']['static']>,
    private readonly opts: CoordinatorOptions,
  ) {
    const peers = new Map(cfg.peers.map((p) => [p.pod_id, { podId: p.pod_id, address: p.address }]))
    peers.set(opts.podId, { podId: opts.podId, address: opts.address })
    this.list = [...peers.values()].sort((a, b) => a.podId.localeCompare(b.podId))
    // The cluster plugin's validate refuses this first; a coordinator built directly checks it too.
    const leader = staticLeaderProblems(cfg, opts.podId)
    if (leader.length > 0) throw new Error(leader[0])
  }

  async start(): Promise<void> {}

  async stop(): Promise<void> {}

  leadership(): Leadership {
    const leader = this.list.find((p) => p.podId === this.cfg.leader)
    return {
      leaderId: this.cfg.leader,
      leaderAddress: leader?.address ?? null,
      term: 1,
      isLeader: this.cfg.leader === this.opts.podId,
    }
  }

  peers(): Peer[] {
    return [...this.list]
  }

  subscribe(_fn: (change: CoordinatorChange) => void): () => void {
    return () => {}
  }
}
