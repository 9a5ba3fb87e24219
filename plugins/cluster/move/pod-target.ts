import type { Logger } from '../../../src/host/logger.ts'
import type { MoveContext, MoveFit, MoveTarget, TargetInstance } from '../../gateway/api.ts'
import { type LinkDeps, MoveLinks } from './links.ts'
import type { TableWant } from './schemas.ts'

export interface PodTargetDeps extends LinkDeps {
  log: Logger
}

/**
 * PodTarget: a move's target on another pod of the cluster (MoveTarget), for the gateway's move saga
 * run by the pod that holds the source. Its steps are the target pod's (its signed
 * /internal/moves/:moveId/target/* routes, MovePod there) and the routing table, which every pod's
 * /v1 follows:
 *
 * - switchTo: the target takes requests on its pod and enters the table; once every healthy pod's
 *   table lists it, the source leaves the table (still serving whatever still reaches it) until
 *   every table has dropped it. The saga then stops this pod's own /v1 sending it requests.
 * - restoreSource and release walk back the same way: the source rejoins every table before the
 *   target leaves them, drains and unloads.
 *
 * Each step waits until every table says what the next one needs, so an edge never routes to an
 * instance that no longer takes requests, and never has no entry at all. `served` and `withdrawn`
 * record what may have happened (set before the call that does it), and every step is idempotent,
 * so a rollback after a lost answer is safe.
 */
export class PodTarget implements MoveTarget {
  readonly podId: string
  private readonly links: MoveLinks
  private target: TargetInstance | null = null
  private served = false
  private withdrawn = false

  constructor(
    private readonly d: PodTargetDeps,
    private readonly move: MoveContext,
    pod: { podId: string; address: string },
  ) {
    this.podId = pod.podId
    this.links = new MoveLinks(d, move.move_id, pod)
  }

  async check(fit: MoveFit): Promise<void> {
    await this.links.step('target/check', { fit, gpuIds: this.move.target_gpu_ids })
  }

  async load(req: Parameters<MoveTarget['load']>[0]): Promise<TargetInstance> {
    this.target = await this.links.step<TargetInstance>('target/load', req)
    return this.target
  }

  ready(onProgress: (percent: number, phase: string) => void, signal: AbortSignal): Promise<void> {
    return this.links.followStart(this.target!.instanceId, onProgress, signal)
  }

  async switchTo(signal: AbortSignal | null): Promise<void> {
    const instanceId = this.target!.instanceId
    // Forced: the tables are waited for, but a pod slow to follow holds nothing up.
    const settle = (wait: Promise<void>) => (signal ? wait : wait.catch(() => {}))
    const on = signal ?? undefined
    if (signal || !this.served) {
      this.served = true
      await this.links.step('target/serve', { instanceId })
    }
    await settle(this.links.tables(this.targetEntry(true), on))
    signal?.throwIfAborted()
    this.withdrawn = true
    this.d.local.withdraw(this.move.source.id)
    await settle(this.links.tables(this.sourceEntry(false), on))
    signal?.throwIfAborted()
  }

  async commit(): Promise<void> {
    await this.links.step('target/commit', { instanceId: this.target!.instanceId })
  }

  async restoreSource(): Promise<void> {
    if (!this.withdrawn) return
    this.d.local.rejoin(this.move.source.id)
    await this.links
      .tables(this.sourceEntry(true))
      .catch((e) => this.warn('the source rejoining the tables', e))
  }

  async release(drainTimeoutMs: number): Promise<void> {
    const target = this.target
    if (!target) return
    if (this.served) {
      await this.links.step('target/withdraw', { instanceId: target.instanceId })
      await this.links
        .tables(this.targetEntry(false))
        .catch((e) => this.warn('the target leaving the tables', e))
    }
    const { unloadMs, requestMs } = this.d.timeouts
    await this.links.step(
      'target/release',
      { instanceId: target.instanceId, drainTimeoutMs },
      drainTimeoutMs + unloadMs + requestMs,
    )
  }

  private sourceEntry(present: boolean): TableWant {
    const s = this.move.source
    return { model: s.served_model_name, podId: this.d.podId, port: s.port, present }
  }

  private targetEntry(present: boolean): TableWant {
    const model = this.move.source.served_model_name
    return { model, podId: this.podId, port: this.target!.port, present }
  }

  private warn(what: string, err: unknown): void {
    const error = err instanceof Error ? err.message : String(err)
    this.d.log.warn(`move ${this.move.move_id}: rollback: ${what} failed`, { error })
  }
}
