import { AppError } from '../../src/http/errors.ts'
import type { ClusterStateRepo } from './repo.ts'
import { CLUSTER_HEADERS } from './signing.ts'

/** TERM_HEADER: every internal request carries the highest leader term its sender has seen. */
export const TERM_HEADER = CLUSTER_HEADERS.term

/**
 * TermFence keeps the highest leader term this pod has seen, persisted so a restart cannot lower it.
 * Terms come from the coordination service (etcd's winning key revision, the Lease's
 * leaseTransitions), never from a counter of ours. A request under a lower term comes from a deposed
 * leader (or a pod that missed an election): 409 STALE_TERM, with the current term in the
 * `X-Cluster-Term` response header so the sender can catch up.
 */
export class TermFence {
  private highest: number

  constructor(
    private readonly repo: ClusterStateRepo,
    private readonly onRaise: (term: number) => void = () => {},
  ) {
    this.highest = repo.get<number>('term') ?? 0
  }

  get term(): number {
    return this.highest
  }

  /** observe raises the highest term seen; true when it rose. */
  observe(term: number): boolean {
    if (!Number.isSafeInteger(term) || term <= this.highest) return false
    this.highest = term
    this.repo.set('term', term)
    this.onRaise(term)
    return true
  }

  /**
   * admit checks a request's term header: absent is refused (every internal request carries one),
   * lower than the highest seen is STALE_TERM. It never raises ours: the header is outside the
   * signature (method, path, timestamp, body), so a term is only believed from a signed body
   * (a heartbeat's state, an event, a routing table) or from the coordination service.
   */
  admit(header: string | null): void {
    const term = header === null || !/^\d{1,15}$/.test(header) ? Number.NaN : Number(header)
    if (!Number.isSafeInteger(term))
      throw new AppError(400, 'VALIDATION_ERROR', 'X-Cluster-Term must be a non-negative integer')
    if (term < this.highest) throw staleTerm(term, this.highest)
  }
}

export function staleTerm(given: number, current: number): AppError {
  return new AppError(
    409,
    'STALE_TERM',
    `term ${given} is older than term ${current} this pod has seen: the sender is no longer leader`,
    'conflict',
    undefined,
    { [TERM_HEADER]: String(current) },
  )
}
