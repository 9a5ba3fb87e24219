import { closeSync, openSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { LOCK_EX, withLock } from '../gpu/flock.ts'
import { type KvcachedUsage, readSegmentFd, writeSegmentFd } from '../gpu/kvcached.ts'

/**
 * KvcachedSegment imitates how kvcached's engines publish the shared pool's usage in
 * `/dev/shm/<name>` (the format and locking are the gateway's own, in src/gpu/kvcached.ts). Engines
 * sharing a GPU share one segment; the first creates it with the GPU budget as total, each adds its
 * prealloc and in-flight KV. A clean exit removes the file even if other engines still use it: the
 * documented kvcached hazard the gateway has to cope with.
 */

/** Bytes each kvcached engine preallocates in the shared pool (a fixed 2 GiB). */
export const KVCACHED_PREALLOC_MIB = 2048

const EMPTY: KvcachedUsage = { totalBytes: 0, usedBytes: 0, preallocBytes: 0 }

export class KvcachedSegment {
  private fd: number | undefined
  private myUsed = 0

  private constructor(
    readonly path: string,
    fd: number,
  ) {
    this.fd = fd
  }

  /** open joins (or creates with `totalBytes`) the segment and adds this engine's prealloc. */
  static open(shmDir: string, name: string, totalBytes: number, preallocBytes: number): KvcachedSegment {
    const path = join(shmDir, name)
    closeSync(openSync(path, 'a+'))
    const seg = new KvcachedSegment(path, openSync(path, 'r+'))
    seg.update((u) => ({
      totalBytes: u.totalBytes > 0 ? u.totalBytes : totalBytes,
      usedBytes: u.usedBytes,
      preallocBytes: u.preallocBytes + preallocBytes,
    }))
    return seg
  }

  private update(fn: (u: KvcachedUsage) => KvcachedUsage): void {
    const fd = this.fd
    if (fd === undefined) return
    withLock(fd, LOCK_EX, () => writeSegmentFd(fd, fn(readSegmentFd(fd) ?? EMPTY)))
  }

  /** setUsed records this engine's in-flight KV bytes (the segment holds the sum over engines). */
  setUsed(bytes: number): void {
    const delta = bytes - this.myUsed
    if (delta === 0) return
    this.myUsed = bytes
    this.update((u) => ({ ...u, usedBytes: u.usedBytes + delta }))
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
