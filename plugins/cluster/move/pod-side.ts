import { abortable, WaitError } from '../../../src/host/abortable.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { AppError } from '../../../src/http/errors.ts'
import type { GatewayPodApi, LoadRequest, MoveFit } from '../../gateway/api.ts'
import type { RoutingTable } from '../schemas.ts'
import type { TableWant } from './schemas.ts'

/** StandbyCluster: what a pod's part of a move needs of the cluster (ClusterService). */
export interface StandbyCluster {
  readonly podId: string
  routingTable(): RoutingTable
  standby(instanceId: string, on: boolean): void
}

/** How long the target's engine gets to answer /health at the switch (as the single-pod move). */
const SWITCH_HEALTH_MS = 5000

/**
 * MovePod: what one pod does on its own instances for a move across pods, called by the pod that
 * runs the move (directly for the source, over the signed internal routes for the target). Each step
 * is idempotent, so a step repeated by a rollback after a lost answer does no harm:
 *
 * - check / loadTarget: the target GPUs have room; the target loads out of routing, its move running.
 * - serve: the target answers /health, takes requests here, then enters the routing table.
 * - withdraw: an instance leaves the routing table (`standby`), still serving what reaches it.
 * - stopRouting / restore: this pod's own /v1 stops (or resumes) sending it requests.
 * - release: the instance out of routing, drained (up to a deadline), unloaded, gone.
 * - commit: the target's move is over (it may be slept, unloaded, moved again).
 * - awaitTable: this pod's routing table says what the move needs before it goes on.
 */
export class MovePod {
  constructor(
    private readonly gateway: GatewayPodApi,
    private readonly cluster: StandbyCluster,
    private readonly bus: EventBus,
    private readonly log: Logger,
  ) {}

  check(fit: MoveFit, gpuIds: number[]): Promise<void> {
    return this.gateway.moves.checkFits(fit, gpuIds)
  }

  async loadTarget(req: LoadRequest): Promise<{ instanceId: string; port: number }> {
    const res = await this.gateway.load(req, { routing: false, operation: 'move' })
    // Out of the table from the start: it is reported once active, and must not be routed to before the switch.
    this.cluster.standby(res.instance_id, true)
    return { instanceId: res.instance_id, port: res.port }
  }

  async serve(instanceId: string): Promise<void> {
    const state = this.gateway.routingOf(instanceId).state
    if (state !== 'active') throw new AppError(409, 'INVALID_STATE', `Target ${instanceId} is ${state}`)
    if (!(await this.gateway.engineHealthy(instanceId, SWITCH_HEALTH_MS)))
      throw new AppError(503, 'TARGET_UNHEALTHY', `Target ${instanceId} stopped answering /health`)
    this.gateway.route(instanceId, true)
    this.cluster.standby(instanceId, false)
  }

  withdraw(instanceId: string): void {
    this.gateway.routingOf(instanceId)
    this.cluster.standby(instanceId, true)
  }

  stopRouting(instanceId: string): void {
    this.gateway.route(instanceId, false)
  }

  /** restore: the instance takes requests again and is back in the table (unless it can no longer serve). */
  restore(instanceId: string): void {
    const { state } = this.gateway.routingOf(instanceId)
    if (state === 'active' || state === 'sleeping') this.gateway.route(instanceId, true)
    this.cluster.standby(instanceId, false)
  }

  commit(instanceId: string): void {
    this.gateway.endMove(instanceId)
  }

  /**
   * release takes the instance out of routing, waits for its in-flight requests up to
   * `drainTimeoutMs` (0: not at all; past it, it goes on: the deadline is the operator's), ends its
   * move and unloads it, and waits until its engine is gone (within `stopBudgetMs`).
   */
  async release(instanceId: string, drainTimeoutMs: number, stopBudgetMs: number): Promise<void> {
    if (!this.gateway.get(instanceId)) return
    const gw = this.gateway
    this.cluster.standby(instanceId, true)
    gw.route(instanceId, false)
    if (drainTimeoutMs > 0) {
      try {
        await gw.drained(instanceId, { timeoutMs: drainTimeoutMs })
      } catch (err) {
        if (!(err instanceof WaitError && err.kind === 'timeout')) throw err
        this.log.warn(
          `move: drain timeout on ${instanceId} with ${gw.routingOf(instanceId).inFlight} request(s) still open`,
        )
      }
    }
    gw.endMove(instanceId)
    const { state } = gw.routingOf(instanceId)
    if (state !== 'removed' && state !== 'stopping') await gw.unload(instanceId)
    await gw.waitFor(instanceId, (s) => s === 'removed', {
      timeoutMs: stopBudgetMs,
      what: `the unload of ${instanceId}`,
    })
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
