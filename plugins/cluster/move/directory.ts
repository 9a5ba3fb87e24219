import { AppError, notFound } from '../../../src/http/errors.ts'
import { sseResponse } from '../../../src/http/sse.ts'
import type { GatewayPodApi } from '../../gateway/api.ts'
import type { PeerCalls } from '../peer-client.ts'
import { relaySse } from '../remote/relay.ts'
import { peerFailure } from '../remote/service.ts'
import type { Pod } from '../schemas.ts'
import type { ClusterMoveRecord } from './schemas.ts'

/** DirectoryCluster: the pods a move may run on (ClusterService). */
export interface DirectoryCluster {
  readonly podId: string
  pods(): Pod[]
}

/** Where a move runs: this pod (null) or a peer, with the record it gave. */
type Located = { pod: { podId: string; address: string }; record: ClusterMoveRecord } | null

/**
 * MoveDirectory finds a move from any pod: a move runs on the pod that holds its source (its
 * gateway's move saga, whatever the target), so a pod that does not run it asks every
 * other pod at once (`GET /internal/moves/:moveId`) and the one that answers is the one to follow
 * (its `/internal/moves/:moveId/events`, relayed byte for byte) or cancel. Moves are rare and pods
 * few: asking all of them beats keeping a cluster-wide index that a restart would lose.
 */
export class MoveDirectory {
  constructor(
    private readonly cluster: DirectoryCluster,
    private readonly peers: PeerCalls,
    private readonly gateway: GatewayPodApi,
    /** targetPodOf: the target pod of a move across pods this pod runs (undefined: one on this pod). */
    private readonly targetPodOf: (moveId: string) => string | undefined,
    private readonly requestMs: number,
  ) {}

  /** localRecord: a move this pod runs (its gateway's, to this pod or another), as the cluster shows it. */
  localRecord(moveId: string): ClusterMoveRecord | undefined {
    const own = this.gateway.moves.get(moveId)
    if (!own) return undefined
    const podId = this.cluster.podId
    return { ...own, podId, targetPodId: this.targetPodOf(moveId) ?? podId }
  }

  /** localEvents: the `move_progress` stream of a move this pod runs (404 MOVE_NOT_FOUND otherwise). */
  localEvents(moveId: string, signal: AbortSignal): Response {
    if (!this.gateway.moves.get(moveId)) throw unknownMove(moveId)
    return sseResponse(
      (sink) =>
        this.gateway.moves.subscribe(
          moveId,
          (e) => sink.send('move_progress', e),
          () => sink.close(),
        ) ?? undefined,
      { signal },
    )
  }

  async record(moveId: string): Promise<ClusterMoveRecord> {
    const local = this.localRecord(moveId)
    if (local) return local
    return (await this.locate(moveId))!.record
  }

  /** events: the move's stream, from this pod or relayed from the pod that runs it. */
  async events(moveId: string, signal: AbortSignal): Promise<Response> {
    const at = await this.locate(moveId)
    if (!at) return this.localEvents(moveId, signal)
    const cancel = new AbortController()
    const stop = () => cancel.abort()
    signal.addEventListener('abort', stop, { once: true })
    try {
      const res = await this.peers.stream(at.pod, `/internal/moves/${enc(moveId)}/events`, cancel.signal)
      return relaySse(res, cancel, () => signal.removeEventListener('abort', stop))
    } catch (err) {
      cancel.abort()
      signal.removeEventListener('abort', stop)
      throw peerFailure(at.pod, err)
    }
  }

  /** cancel: on the pod that runs the move (`here` when it is this one). */
  async cancel(moveId: string, force: boolean, here: () => void): Promise<void> {
    const at = await this.locate(moveId)
    if (!at) return here()
    try {
      await this.peers.request(at.pod, 'DELETE', `/internal/moves/${enc(moveId)}?force=${force}`)
    } catch (err) {
      throw peerFailure(at.pod, err)
    }
  }

  /** locate: null when this pod runs the move; else the peer that does (404 MOVE_NOT_FOUND: none). */
  private async locate(moveId: string): Promise<Located> {
    if (this.localRecord(moveId)) return null
    const pods = this.cluster.pods().filter((p) => p.podId !== this.cluster.podId && p.address)
    try {
      return await Promise.any(
        pods.map(async (p) => {
          const pod = { podId: p.podId, address: p.address }
          const record = await this.peers.request<ClusterMoveRecord>(
            pod,
            'GET',
            `/internal/moves/${enc(moveId)}`,
            undefined,
            { timeoutMs: this.requestMs },
          )
          return { pod, record }
        }),
      )
    } catch (err) {
      const unreachable = err instanceof AggregateError && err.errors.some((e) => !isNotFound(e))
      throw unknownMove(moveId, unreachable ? ' (some pods could not be asked)' : '')
    }
  }
}

function isNotFound(err: unknown): boolean {
  return err instanceof AppError && err.status === 404
}

function unknownMove(moveId: string, more = ''): AppError {
  return notFound(`No move with id '${moveId}' on any pod${more}`, 'MOVE_NOT_FOUND')
}

const enc = encodeURIComponent
