import type { GpuSnapshot } from '../../../src/gpu/smi.ts'
import { WaitError } from '../../../src/host/abortable.ts'
import type { Logger } from '../../../src/host/logger.ts'
import type { SpanBase } from '../../../src/host/telemetry/spans.ts'
import { AppError, badRequest, insufficientMemory } from '../../../src/http/errors.ts'
import type {
  LoadRequest,
  LoadResponse,
  MoveContext,
  MoveFit,
  MoveSteps,
  MoveTarget,
  TargetInstance,
} from '../api.ts'
import type { ManagedInstance } from '../instance.ts'
import type { Operation } from '../lifecycle.ts'
import { effectiveFreeMib } from '../placement.ts'

/** MoveHost: what a move drives on this pod, and only that (the gateway's service implements it). */
export interface MoveHost {
  readonly instances: ReadonlyMap<string, ManagedInstance>
  require(id: string): ManagedInstance
  load(
    req: LoadRequest,
    opts: { routing: boolean; operation: Operation; trace?: SpanBase | null },
  ): Promise<LoadResponse>
  unload(id: string): Promise<void>
  gpuSnapshot(): Promise<GpuSnapshot>
  pendingMibByGpu(snapshot: GpuSnapshot): Map<number, number>
  stopBudgetMs(): number
}

/** How long the target's engine gets to answer /health at the switch. */
const SWITCH_HEALTH_MS = 5000

/**
 * LocalSteps: a move target's steps on this pod's GPUs, by instance id (MoveSteps). The move to GPUs
 * of this pod takes them through localTarget; a cluster's target pod takes them for the pod that runs
 * a move across pods; the saga releases its source with `release`. Each is safe to repeat.
 */
export class LocalSteps implements MoveSteps {
  constructor(
    private readonly host: MoveHost,
    private readonly log: Logger,
  ) {}

  /**
   * check: the target GPUs exist and have room for what `fit` describes (the instance's measured
   * footprint, or its engine's share of each GPU when larger). A move across pods asks the target pod
   * with the source pod's figures (moveFit of the source's record).
   */
  async check(fit: MoveFit, target: number[]): Promise<void> {
    const snap = await this.host.gpuSnapshot()
    if (!snap.available)
      throw new AppError(503, 'GPU_PROBE_UNAVAILABLE', `No GPU probe available: ${snap.reason}`)
    const byIndex = new Map(snap.gpus.map((g) => [g.index, g]))
    const missing = target.filter((g) => !byIndex.has(g))
    if (missing.length) throw badRequest(`GPU ${missing.join(', ')} does not exist`)
    const pending = this.host.pendingMibByGpu(snap)
    const footprintGib = fit.footprint_gib
    if (footprintGib === null)
      throw badRequest(
        `No memory measurement for ${fit.instance_id} (no memory_baseline_by_gpu or memory metrics); cannot check the target fits`,
      )
    for (const idx of target) {
      const g = byIndex.get(idx)!
      const freeGib = effectiveFreeMib(g, pending) / 1024
      const total = g.memoryTotalMib ? g.memoryTotalMib / 1024 : null
      const engineNeeds = fit.sharedcache_enabled || total === null ? 0 : fit.gpu_memory_utilization * total
      const need = Math.max(footprintGib, engineNeeds)
      if (freeGib < need)
        throw insufficientMemory(
          `GPU ${idx} has ${freeGib.toFixed(2)} GiB free; moving ${fit.instance_id} needs ${need.toFixed(2)} GiB per GPU`,
        )
    }
  }

  async load(req: LoadRequest, trace: SpanBase | null = null): Promise<TargetInstance> {
    const res = await this.host.load(req, { routing: false, operation: 'move', trace })
    return { instanceId: res.instance_id, port: res.port }
  }

  async ready(
    id: string,
    onProgress: (percent: number, phase: string) => void,
    signal: AbortSignal,
  ): Promise<void> {
    const target = this.host.require(id)
    const stop = target.events.subscribe(
      new Set(['progress']),
      true,
      (e) => onProgress(Number(e.data.percent ?? 0), String(e.data.phase)),
      () => {},
    )
    try {
      await target.lifecycle.waitUntil((l) => l.state !== 'starting', {
        signal,
        what: `the start of the target ${id}`,
      })
    } finally {
      stop()
    }
    if (target.status !== 'active')
      throw new Error(`target failed to start: ${target.row.error ?? target.status}`)
  }

  async serve(id: string, opts: { signal?: AbortSignal; health?: boolean } = {}): Promise<void> {
    const target = this.host.require(id)
    const state = target.lifecycle.state
    if (state !== 'active') throw new AppError(409, 'INVALID_STATE', `Target ${id} is ${state}`)
    // Switch only to a target that answers now; a cancel may land while we ask.
    if (opts.health !== false && !(await target.client.health(SWITCH_HEALTH_MS)))
      throw new AppError(503, 'TARGET_UNHEALTHY', `Target ${id} stopped answering /health`)
    opts.signal?.throwIfAborted()
    target.lifecycle.route(true)
  }

  commit(id: string): void {
    const l = this.host.require(id).lifecycle
    if (l.operation === 'move') l.end('move')
  }

  async release(id: string, drainTimeoutMs: number, budgetMs = this.host.stopBudgetMs()): Promise<void> {
    const inst = this.host.instances.get(id)
    if (!inst) return
    const l = inst.lifecycle
    l.route(false)
    if (drainTimeoutMs > 0) {
      try {
        await l.drained({ timeoutMs: drainTimeoutMs })
      } catch (err) {
        if (!(err instanceof WaitError && err.kind === 'timeout')) throw err
        this.log.warn(`move: drain timeout on ${id} with ${l.inFlight} request(s) still open`)
      }
    }
    if (l.operation === 'move') l.end('move')
    if (l.state !== 'removed' && l.state !== 'stopping') await this.host.unload(id)
    await l.waitUntil((x) => x.state === 'removed', { timeoutMs: budgetMs, what: `the unload of ${id}` })
  }
}

/** localTarget: a move's target on GPUs of this pod (MoveTarget), over LocalSteps. */
export function localTarget(steps: MoveSteps, move: MoveContext): MoveTarget {
  let loaded: TargetInstance | null = null
  const id = () => loaded!.instanceId
  return {
    podId: null,
    check: (fit) => steps.check(fit, move.target_gpu_ids),
    load: async (req, trace) => {
      loaded = await steps.load(req, trace)
      return loaded
    },
    ready: (onProgress, signal) => steps.ready(id(), onProgress, signal),
    // Forced, the switch is immediate: no health check, no cancel.
    switchTo: (signal) => steps.serve(id(), signal ? { signal } : { health: false }),
    commit: async () => steps.commit(id()),
    // The source is routed by this pod alone, which the saga restores.
    restoreSource: async () => {},
    release: async (drainMs) => {
      if (loaded) await steps.release(loaded.instanceId, drainMs)
    },
  }
}
