import type { Logger } from '../../../src/host/logger.ts'

/**
 * Coordination: where cluster leadership and membership come from. modelgate never elects a leader
 * itself; it borrows the decision from a coordination service operators already run (an etcd
 * election, as etcd's `client/v3/concurrency.Election` does it, or a Kubernetes Lease, as
 * client-go's `tools/leaderelection` does it), or from YAML (`static`, no failover).
 */

/** Peer: a pod as the coordination service lists it. `address` is its base URL, e.g. http://10.0.0.5:3000 */
export interface Peer {
  podId: string
  address: string
}

/**
 * Leadership: who leads, under which term (the fencing token), and whether this pod leads *now*.
 * `term` is the etcd winning key's create revision, the Lease's `leaseTransitions`, or 1 (static):
 * it only grows, so a command carrying a lower term than one already seen is stale.
 */
export interface Leadership {
  leaderId: string | null
  leaderAddress: string | null
  term: number
  /**
   * isLeader is computed when read: true only while this pod's last successful renewal is younger
   * than the renew deadline. A leader that cannot renew (paused, partitioned) stops acting at once,
   * without waiting for a timer to tell it.
   */
  isLeader: boolean
}

export type CoordinatorChange =
  | { type: 'leadership'; leadership: Leadership }
  | { type: 'peers'; peers: Peer[] }

export interface Coordinator {
  readonly kind: 'etcd' | 'kubernetes' | 'static'
  /**
   * start registers this pod and begins campaigning; it resolves once the pod is registered (not
   * once it leads), or rejects with a readable error when the coordination service is unreachable
   * within its deadline.
   */
  start(): Promise<void>
  /** stop resigns (if leading) and withdraws the registration; safe before start and twice. */
  stop(deadline: AbortSignal): Promise<void>
  leadership(): Leadership
  /** peers: every registered pod, this one included, sorted by podId. */
  peers(): Peer[]
  /** subscribe is called on every leadership or membership change; returns the unsubscribe. */
  subscribe(fn: (change: CoordinatorChange) => void): () => void
}

export interface CoordinatorOptions {
  podId: string
  /** address: this pod's base URL as its peers reach it. */
  address: string
  log: Logger
}
