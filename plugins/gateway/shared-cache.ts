import {
  addUsage,
  instanceSegmentName,
  type KvcachedUsage,
  readEngineUsage,
  removeEngineSegments,
} from '../../src/gpu/kvcached.ts'
import type { Logger } from '../../src/host/logger.ts'
import type { ManagedInstance } from './instance.ts'

const EMPTY: KvcachedUsage = { totalBytes: 0, usedBytes: 0, preallocBytes: 0 }

/**
 * SharedCache reads and cleans up the kvcached segments of shared-cache engines. kvcached keeps one
 * segment per engine (its start writes `(its_total, 0, 0)`, its updates overwrite used and
 * prealloc), so each instance is launched with its own name, derived from its id
 * (instanceSegmentName, set as KVCACHED_IPC_NAME): no column, and a re-adopted engine keeps it.
 * A GPU's pool is the sum of the segments of the engines on it (a TP engine's split evenly over its
 * GPUs). An engine removes its own segment on a clean exit; a killed one leaves it stale, and the
 * gateway removes it once the engine is gone. No engine ever touches another's segment, so nothing
 * has to be restored.
 */
export class SharedCache {
  constructor(
    private readonly shmDir: string,
    private readonly instances: () => Iterable<ManagedInstance>,
    private readonly log: Logger,
  ) {}

  /** usage: an instance's own figures (its segments summed), null without shared cache or segment. */
  usage(inst: ManagedInstance): KvcachedUsage | null {
    if (!inst.row.sharedcache_enabled) return null
    return readEngineUsage(instanceSegmentName(inst.id), this.shmDir)
  }

  /**
   * usageByGpu: per GPU index, the sum of the segments of the shared-cache engines placed on it
   * (failed ones hold nothing), each engine's split evenly over its GPUs.
   */
  usageByGpu(): Map<number, KvcachedUsage> {
    const out = new Map<number, KvcachedUsage>()
    for (const inst of this.instances()) {
      if (inst.status === 'failed') continue
      const seg = this.usage(inst)
      if (!seg) continue
      const share = inst.row.gpu_ids.length
      for (const g of inst.row.gpu_ids) out.set(g, addUsage(out.get(g) ?? EMPTY, seg, share))
    }
    return out
  }

  /** cleanup, once an instance's engine is gone: remove the segments it left (SIGKILL, crash). */
  cleanup(inst: ManagedInstance): void {
    if (!inst.row.sharedcache_enabled) return
    const removed = removeEngineSegments(instanceSegmentName(inst.id), this.shmDir)
    if (removed.length)
      this.log.info('removed the stale kvcached segment of a stopped engine', {
        instance: inst.id,
        segments: removed.join(','),
      })
  }
}
