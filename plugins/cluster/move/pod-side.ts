import { abortable, WaitError } from '../../../src/host/abortable.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import { AppError } from '../../../src/http/errors.ts'
import type { GatewayPodApi, LoadRequest, MoveFit, TargetInstance } from '../../gateway/api.ts'
import type { RoutingTable } from '../schemas.ts'
import type { TableWant } from './schemas.ts'

/** StandbyCluster: what a pod's part of a move needs of the cluster (ClusterService). */
export interface StandbyCluster {
  readonly podId: string
  routingTable(): RoutingTable
  standby(instanceId: string, on: boolean): void
}

/**
 * MovePod: what one pod does on its own instances for a move across pods, called by the pod that
 * runs the move (directly for the source, over the signed internal routes for the target). The
 * instance steps are the gateway's own (GatewayMoves.here, as a move on one pod takes them); what a
 * pod adds is its routing table: an instance is out of it (`standby`) until it serves, and while it
 * leaves. Each step is idempotent, so a step repeated by a rollback after a lost answer does no harm:
 *
 * - check / loadTarget: the target GPUs have room; the target loads out of routing, its move running.
 * - serve: the target answers /health, takes requests here, then enters the routing table.
 * - withdraw / rejoin: an instance leaves (or re-enters) the routing table, serving what reaches it.
 * - release: the instance out of the table and routing, drained (up to a deadline), unloaded, gone.
 * - commit: the target's move is over (it may be slept, unloaded, moved again).
 * - awaitTable: this pod's routing table says what the move needs before it goes on.
 */
export class MovePod {
  constructor(
    private readonly gateway: GatewayPodApi,
    private readonly cluster: StandbyCluster,
    private readonly bus: EventBus,
  ) {}

  check(fit: MoveFit, gpuIds: number[]): Promise<void> {
    return this.gateway.moves.here.check(fit, gpuIds)
  }

  async loadTarget(req: LoadRequest): Promise<TargetInstance> {
    const target = await this.gateway.moves.here.load(req)
    // Out of the table from the start: it is reported once active, and must not be routed to before the switch.
    this.cluster.standby(target.instanceId, true)
    return target
  }

  async serve(instanceId: string): Promise<void> {
    await this.gateway.moves.here.serve(instanceId)
    this.cluster.standby(instanceId, false)
  }

  withdraw(instanceId: string): void {
    this.gateway.routingOf(instanceId)
    this.cluster.standby(instanceId, true)
  }

  rejoin(instanceId: string): void {
    this.gateway.routingOf(instanceId)
    this.cluster.standby(instanceId, false)
  }

  commit(instanceId: string): void {
    this.gateway.moves.here.commit(instanceId)
  }

  /** release: out of the table first, then the gateway's release (drain up to `drainTimeoutMs`, unload). */
  async release(instanceId: string, drainTimeoutMs: number, stopBudgetMs: number): Promise<void> {
    if (!this.gateway.get(instanceId)) return
    this.cluster.standby(instanceId, true)
    await this.gateway.moves.here.release(instanceId, drainTimeoutMs, stopBudgetMs)
  }

  /**
   * awaitTable resolves with this pod's table version once the table says what `want` asks (woken by
   * each table this pod adopts); past `timeoutMs` it is 504 TABLE_TIMEOUT.
   */
  async awaitTable(want: TableWant, timeoutMs: number, signal?: AbortSignal): Promise<number> {
    const holds = () => tableHas(this.cluster.routingTable(), want) === want.present
    if (holds()) return this.cluster.routingTable().version
    let off = () => {}
    const adopted = new Promise<void>((resolve) => {
      off = this.bus.on('cluster.routing', () => {
        if (holds()) resolve()
      })
    })
    const what = `pod ${this.cluster.podId}'s routing table to ${want.present ? 'list' : 'drop'} ${want.model} on ${want.podId}:${want.port}`
    try {
      await abortable(adopted, { timeoutMs, what, ...(signal ? { signal } : {}) })
    } catch (err) {
      if (err instanceof WaitError && err.kind === 'timeout')
        throw new AppError(504, 'TABLE_TIMEOUT', err.message)
      throw err
    } finally {
      off()
    }
    return this.cluster.routingTable().version
  }
}

/** tableHas: the table lists `want.model` on that pod and port (any weight). */
export function tableHas(table: RoutingTable, want: TableWant): boolean {
  return (table.entries[want.model] ?? []).some((e) => e.podId === want.podId && e.vllmPort === want.port)
}
