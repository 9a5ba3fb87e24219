import {
  type KvcachedUsage,
  readKvcachedSegment,
  removeKvcachedSegment,
  sharedCacheSegmentName,
  writeKvcachedSegment,
} from '../../src/gpu/kvcached.ts'
import type { Logger } from '../../src/host/logger.ts'
import type { ManagedInstance } from './instance.ts'

/**
 * SharedCache keeps the shared KV cache pool's segment (kvcached: one segment per engine's GPU set)
 * right as engines come and go. An engine removes the segment on SIGTERM even when others on the
 * same GPUs still use it.
 */
export class SharedCache {
  constructor(
    private readonly shmDir: string,
    private readonly instances: () => Iterable<ManagedInstance>,
    private readonly log: Logger,
  ) {}

  private othersOnSegment(inst: ManagedInstance): ManagedInstance[] {
    const name = sharedCacheSegmentName(inst.row.gpu_ids)
    return [...this.instances()].filter(
      (o) =>
        o !== inst &&
        o.row.sharedcache_enabled &&
        o.status !== 'failed' &&
        sharedCacheSegmentName(o.row.gpu_ids) === name,
    )
  }

  /** snapshot: the segment as it is before an engine of it stops (null without shared cache). */
  snapshot(inst: ManagedInstance): KvcachedUsage | null {
    if (!inst.row.sharedcache_enabled) return null
    return readKvcachedSegment(sharedCacheSegmentName(inst.row.gpu_ids), this.shmDir)
  }

  /**
   * restore after an engine stopped: if others remain on the segment, put it back as it was; if
   * none remain, remove a stale one.
   */
  restore(inst: ManagedInstance, before: KvcachedUsage | null): void {
    if (!inst.row.sharedcache_enabled) return
    const name = sharedCacheSegmentName(inst.row.gpu_ids)
    if (this.othersOnSegment(inst).length === 0) {
      removeKvcachedSegment(name, this.shmDir)
      return
    }
    if (before && !readKvcachedSegment(name, this.shmDir)) {
      writeKvcachedSegment(name, before, this.shmDir)
      this.log.info('restored the shared KV cache segment removed by a departing engine', { segment: name })
    }
  }

  /** cleanup after an engine died: the segment goes when no other engine uses it. */
  cleanup(inst: ManagedInstance): void {
    if (inst.row.sharedcache_enabled && this.othersOnSegment(inst).length === 0)
      removeKvcachedSegment(sharedCacheSegmentName(inst.row.gpu_ids), this.shmDir)
  }
}
