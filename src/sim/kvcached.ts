import { closeSync, existsSync, openSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { LOCK_EX, withLock } from '../gpu/flock.ts'
import { type KvcachedUsage, readSegmentFd, sanitizeSegmentName, writeSegmentFd } from '../gpu/kvcached.ts'

/**
 * KvcachedSegment imitates kvcached's MemInfoTracker (kvcached/mem_info_tracker.py,
 * csrc/inc/mem_info_tracker.hpp): every engine instance owns one segment `/dev/shm/<name>`. Its start
 * overwrites the segment with `(its_total, 0, 0)` (`init_kv_cache_limit`), whatever another engine
 * left there; its updates overwrite used and prealloc with its own figures and leave the total (an
 * operator's `kvctl limit` may have changed it). A clean exit removes the file; a SIGKILL leaves it.
 */

/** Bytes each kvcached engine preallocates in the shared pool (a fixed 2 GiB). */
export const KVCACHED_PREALLOC_MIB = 2048

const EMPTY: KvcachedUsage = { totalBytes: 0, usedBytes: 0, preallocBytes: 0 }

export class KvcachedSegment {
  private fd: number | undefined
  private used = 0
  private prealloc = 0

  private constructor(
    readonly path: string,
    fd: number,
  ) {
    this.fd = fd
  }

  /**
   * open starts this engine's segment: `(totalBytes, 0, 0)`, then the prealloc thread's first
   * update `(…, 0, preallocBytes)`. The name is sanitized as kvcached does with KVCACHED_IPC_NAME.
   */
  static open(shmDir: string, name: string, totalBytes: number, preallocBytes: number): KvcachedSegment {
    const path = join(shmDir, sanitizeSegmentName(name))
    closeSync(openSync(path, 'a+'))
    const seg = new KvcachedSegment(path, openSync(path, 'r+'))
    seg.write(() => ({ totalBytes, usedBytes: 0, preallocBytes: 0 }))
    seg.update(0, preallocBytes)
    return seg
  }

  private write(fn: (u: KvcachedUsage) => KvcachedUsage): void {
    const fd = this.fd
    if (fd === undefined) return
    withLock(fd, LOCK_EX, () => writeSegmentFd(fd, fn(readSegmentFd(fd) ?? EMPTY)))
  }

  /** update overwrites used and prealloc with this engine's figures, as update_memory_usage does. */
  private update(used: number, prealloc: number): void {
    this.used = used
    this.prealloc = prealloc
    this.write((u) => ({ totalBytes: u.totalBytes, usedBytes: used, preallocBytes: prealloc }))
  }

  /** setUsed records this engine's in-flight KV bytes (written only when they change). */
  setUsed(bytes: number): void {
    if (bytes !== this.used) this.update(bytes, this.prealloc)
  }

  /** remove deletes the segment, as a real engine's exit handler does. */
  remove(): void {
    this.close()
    rmSync(this.path, { force: true })
  }

  close(): void {
    if (this.fd !== undefined) closeSync(this.fd)
    this.fd = undefined
  }
}

/**
 * defaultIpcName is kvcached's name when KVCACHED_IPC_NAME is set (exact, sanitized) or not
 * (`kvcached_vLLM_<pgid>`, with `_1`, `_2`, … when a segment of that name already exists).
 */
export function defaultIpcName(explicit: string | undefined, shmDir: string): string {
  if (explicit) return sanitizeSegmentName(explicit)
  const base = `kvcached_vLLM_${processGroupId()}`
  if (!existsSync(join(shmDir, base))) return base
  for (let i = 1; i < 100; i++) if (!existsSync(join(shmDir, `${base}_${i}`))) return `${base}_${i}`
  return `${base}_${process.pid}`
}

/**
 * kvcachedLogPrefix is kvcached's own logger format (kvcached/utils.py `get_kvcached_logger`):
 * `[kvcached][LEVEL][YYYY-MM-DD HH:MM:SS][file.py:LINE] ` on stderr.
 */
function kvcachedLogPrefix(level: string, where: string, now: Date): string {
  const p = (n: number) => String(n).padStart(2, '0')
  const at = `${now.getFullYear()}-${p(now.getMonth() + 1)}-${p(now.getDate())} ${p(now.getHours())}:${p(now.getMinutes())}:${p(now.getSeconds())}`
  return `[kvcached][${level}][${at}][${where}] `
}

/**
 * startupGuardWarning is the line kvcached logs (stderr, its own logger format) when it lets an
 * engine start although vLLM's start-up check would refuse it: free memory below utilization ×
 * device. kvcached does not stop the engine there; only the gateway's placement check does.
 */
export function startupGuardWarning(freeBytes: number, requestedBytes: number, now = new Date()): string {
  return (
    `${kvcachedLogPrefix('WARNING', 'patches.py:1936', now)}Ignoring vLLM's whole-device startup memory guard because ` +
    `kvcached provides virtual KV capacity: free=${Math.trunc(freeBytes)} bytes, requested=${Math.trunc(requestedBytes)} bytes`
  )
}

/** ProcessLocalCapacity: the figures of kvcached's replacement of vLLM's memory probe (bytes). */
export interface ProcessLocalCapacity {
  budgetBytes: number
  weightsBytes: number
  torchPeakBytes: number
  cudagraphBytes: number
}

/**
 * processLocalCapacityLine is what kvcached (f8bbb00, #448, and later) logs instead of vLLM's
 * `Available KV cache memory` line: it replaces `determine_available_memory` with budget − weights −
 * torch peak (available), the whole-device non-torch and CUDA-graph figures ignored.
 */
export function processLocalCapacityLine(c: ProcessLocalCapacity, now = new Date()): string {
  const b = (x: number) => Math.trunc(x)
  const available = b(c.budgetBytes) - b(c.weightsBytes) - b(c.torchPeakBytes)
  return (
    `${kvcachedLogPrefix('WARNING', 'patches.py:2128', now)}Using kvcached process-local KV capacity: ` +
    `budget=${b(c.budgetBytes)} bytes, weights=${b(c.weightsBytes)} bytes, torch_peak=${b(c.torchPeakBytes)} bytes, ` +
    `cudagraph=${b(c.cudagraphBytes)} bytes (ignored), available=${available} bytes; ` +
    'whole-device non-torch and CUDA Graph deltas are ignored'
  )
}

/** processGroupId reads our pgid from /proc (Bun has no getpgid); falls back to the pid. */
export function processGroupId(): number {
  try {
    const stat = readFileSync('/proc/self/stat', 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const pgid = Number(fields[2])
    return Number.isInteger(pgid) && pgid > 0 ? pgid : process.pid
  } catch {
    return process.pid
  }
}
