import type { InstanceEvent } from '../../gateway/api.ts'
import type { PeerCalls } from '../peer-client.ts'
import type { Pod } from '../schemas.ts'
import type { MovePod } from './pod-side.ts'
import type { TableWant } from './schemas.ts'
import { readEvents } from './sse-read.ts'

/** MoveTimeouts: the deadlines of a move's waits that the operator's drain deadline does not set. */
export interface MoveTimeouts {
  /** A plain peer call (plugins.cluster.request_timeout_ms). */
  requestMs: number
  /** Every pod's routing table saying what the switch needs. */
  tableMs: number
  /** An unload, from SIGTERM to the engine gone. */
  unloadMs: number
  /** The target's event stream quiet this long (no heartbeat either): its pod is gone. */
  idleMs: number
}

export interface LinkDeps {
  podId: string
  peers: PeerCalls
  pods: () => Pod[]
  local: MovePod
  timeouts: MoveTimeouts
}

/**
 * MoveLinks: how one move across pods reaches the other pods: the target pod's steps (its
 * /internal/moves/:moveId/<step>), the target's start as its pod streams it, and every pod's routing
 * table (this pod's own directly).
 */
export class MoveLinks {
  constructor(
    private readonly d: LinkDeps,
    private readonly moveId: string,
    private readonly target: { podId: string; address: string },
  ) {}

  /** step: one step on the target pod, within the plain call deadline unless `timeoutMs` says more. */
  step<T = unknown>(name: string, body: unknown, timeoutMs?: number): Promise<T> {
    return this.d.peers.request<T>(this.target, 'POST', `/internal/moves/${this.moveId}/${name}`, body, {
      timeoutMs: timeoutMs ?? this.d.timeouts.requestMs,
    })
  }

  /**
   * followStart reads the target's load progress and status from its pod until it is active
   * (resolves) or failed, stopped or gone (throws why); `signal` stops it (a cancel).
   */
  async followStart(
    instanceId: string,
    onProgress: (percent: number, phase: string) => void,
    signal: AbortSignal,
  ) {
    const what = `the start of the target ${instanceId} on pod ${this.target.podId}`
    const events = await this.d.peers.stream(
      this.target,
      `/internal/models/${encodeURIComponent(instanceId)}/events?types=progress,status&replay_logs=false`,
      signal,
    )
    let outcome = `the event stream of ${what} ended`
    await readEvents(
      events,
      (type, data) => {
        const e = data as InstanceEvent
        if (type === 'progress') {
          onProgress(Number(e.data.percent ?? 0), String(e.data.phase))
          return false
        }
        const status = String(e.data.currentStatus)
        if (status === 'active') outcome = 'active'
        else if (status !== 'starting')
          outcome = `target failed to start: ${String(e.data.message ?? status)}`
        return status !== 'starting'
      },
      { signal, idleMs: this.d.timeouts.idleMs, what },
    )
    if (outcome !== 'active') throw new Error(outcome)
  }

  /** tables waits until every healthy pod's routing table says what `want` asks (this pod's too). */
  async tables(want: TableWant, signal?: AbortSignal): Promise<void> {
    const { tableMs, requestMs } = this.d.timeouts
    const self = this.d.podId
    const pods = this.d.pods().filter((p) => p.status === 'healthy' || p.podId === self)
    const path = `/internal/moves/${this.moveId}/table`
    await Promise.all(
      pods.map((p) =>
        p.podId === self
          ? this.d.local.awaitTable(want, tableMs, signal)
          : this.d.peers.request(
              p,
              'POST',
              path,
              { want, timeoutMs: tableMs },
              {
                timeoutMs: tableMs + requestMs,
                ...(signal ? { signal } : {}),
              },
            ),
      ),
    )
  }
}
