import { closeSync, fstatSync, openSync, readFileSync, readSync, rmSync, writeSync } from 'node:fs'
import { join } from 'node:path'
import { LOCK_EX, LOCK_SH, withLock } from './flock.ts'

/**
 * KvcachedSegment imitates kvcached's shared usage segment, `/dev/shm/<name>`: 24 bytes holding three
 * little-endian int64 (total_size, used_size, prealloc_size, in bytes). Engines sharing a GPU share one
 * segment; the first creates it with the GPU budget as total, each adds its prealloc and in-flight KV.
 * A clean exit removes the file even if other engines still use it: the documented kvcached hazard.
 */
export interface KvcachedUsage {
  total: number
  used: number
  prealloc: number
}

export const SEGMENT_BYTES = 24

/** Bytes each kvcached engine preallocates in the shared pool (a fixed 2 GiB). */
export const KVCACHED_PREALLOC_MIB = 2048

export function readSegmentFile(path: string): KvcachedUsage | undefined {
  let fd: number
  try {
    fd = openSync(path, 'r')
  } catch {
    return undefined
  }
  try {
    return withLock(fd, LOCK_SH, () => readUsage(fd))
  } finally {
    closeSync(fd)
  }
}

function readUsage(fd: number): KvcachedUsage {
  const buf = Buffer.alloc(SEGMENT_BYTES)
  const n = fstatSync(fd).size >= SEGMENT_BYTES ? readSync(fd, buf, 0, SEGMENT_BYTES, 0) : 0
  if (n < SEGMENT_BYTES) return { total: 0, used: 0, prealloc: 0 }
  return {
    total: Number(buf.readBigInt64LE(0)),
    used: Number(buf.readBigInt64LE(8)),
    prealloc: Number(buf.readBigInt64LE(16)),
  }
}

function writeUsage(fd: number, usage: KvcachedUsage): void {
  const buf = Buffer.alloc(SEGMENT_BYTES)
  buf.writeBigInt64LE(BigInt(Math.max(0, Math.round(usage.total))), 0)
  buf.writeBigInt64LE(BigInt(Math.max(0, Math.round(usage.used))), 8)
  buf.writeBigInt64LE(BigInt(Math.max(0, Math.round(usage.prealloc))), 16)
  writeSync(fd, buf, 0, SEGMENT_BYTES, 0)
}

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
    const fd = openSync(path, 'a+')
    closeSync(fd)
    const seg = new KvcachedSegment(path, openSync(path, 'r+'))
    seg.update((u) => ({
      total: u.total > 0 ? u.total : totalBytes,
      used: u.used,
      prealloc: u.prealloc + preallocBytes,
    }))
    return seg
  }

  private update(fn: (u: KvcachedUsage) => KvcachedUsage): void {
    const fd = this.fd
    if (fd === undefined) return
    withLock(fd, LOCK_EX, () => writeUsage(fd, fn(readUsage(fd))))
  }

  /** setUsed records this engine's in-flight KV bytes (the segment holds the sum over engines). */
  setUsed(bytes: number): void {
    const delta = bytes - this.myUsed
    if (delta === 0) return
    this.myUsed = bytes
    this.update((u) => ({ ...u, used: u.used + delta }))
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
