/**
 * kvcached reads and writes the shared-KV-cache usage segment (`/dev/shm/<name>`: three little-endian
 * int64 — total, used, prealloc bytes). It is where the memory views get the pool's used and
 * preallocated figures, and the gateway rewrites it when an exiting engine removed a segment other
 * engines still use. Reads take a shared flock through bun:ffi when libc is at hand, without ever
 * blocking; elsewhere they read plainly (a torn read of three aligned words is harmless here).
 */
import { closeSync, constants, fstatSync, openSync, readSync, unlinkSync, writeSync } from 'node:fs'
import { join } from 'node:path'
import { LOCK_EX, LOCK_SH, withLock } from './flock.ts'

export interface KvcachedUsage {
  totalBytes: number
  usedBytes: number
  preallocBytes: number
}

export const KVCACHED_SEGMENT_BYTES = 24
const SEGMENT_PREFIX = 'modelgate'

/** sharedCacheSegmentName names a pool after its GPU set, so engines on the same GPUs share it. */
export function sharedCacheSegmentName(gpuIds: readonly number[]): string {
  const ids = [...new Set(gpuIds)].sort((a, b) => a - b)
  return `${SEGMENT_PREFIX}_GPU${ids.join('_')}`
}

export function defaultShmDir(): string {
  return process.env.MODELGATE_SHM_DIR ?? '/dev/shm'
}

/** decodeSegment reads the three little-endian int64 counters (null when the file is short). */
export function decodeSegment(buf: Buffer, length: number): KvcachedUsage | null {
  if (length < KVCACHED_SEGMENT_BYTES) return null
  return {
    totalBytes: Number(buf.readBigInt64LE(0)),
    usedBytes: Number(buf.readBigInt64LE(8)),
    preallocBytes: Number(buf.readBigInt64LE(16)),
  }
}

export function encodeSegment(usage: KvcachedUsage): Buffer {
  const buf = Buffer.alloc(KVCACHED_SEGMENT_BYTES)
  buf.writeBigInt64LE(BigInt(Math.max(0, Math.trunc(usage.totalBytes))), 0)
  buf.writeBigInt64LE(BigInt(Math.max(0, Math.trunc(usage.usedBytes))), 8)
  buf.writeBigInt64LE(BigInt(Math.max(0, Math.trunc(usage.preallocBytes))), 16)
  return buf
}

/** readSegmentFd reads a segment through an open descriptor (the caller holds any lock). */
export function readSegmentFd(fd: number): KvcachedUsage | null {
  const buf = Buffer.alloc(KVCACHED_SEGMENT_BYTES)
  const n = fstatSync(fd).size >= KVCACHED_SEGMENT_BYTES ? readSync(fd, buf, 0, KVCACHED_SEGMENT_BYTES, 0) : 0
  return decodeSegment(buf, n)
}

/** writeSegmentFd writes the counters in place (no truncation: engines may have it mapped). */
export function writeSegmentFd(fd: number, usage: KvcachedUsage): void {
  writeSync(fd, encodeSegment(usage), 0, KVCACHED_SEGMENT_BYTES, 0)
}

function segmentPath(name: string, shmDir: string): string | null {
  if (!/^[\w.-]+$/.test(name) || name === '.' || name === '..') return null
  return join(shmDir, name)
}

/** readKvcachedSegment returns the pool's figures, or null when the segment is missing or short. */
export function readKvcachedSegment(name: string, shmDir = defaultShmDir()): KvcachedUsage | null {
  const path = segmentPath(name, shmDir)
  if (!path) return null
  let fd: number
  try {
    fd = openSync(path, 'r')
  } catch {
    return null
  }
  try {
    return withLock(fd, LOCK_SH, () => readSegmentFd(fd), { wait: false })
  } catch {
    return null
  } finally {
    closeSync(fd)
  }
}

/**
 * writeKvcachedSegment creates or updates a segment in place (no truncation, so engines that have
 * it mapped never see it shrink), under an exclusive flock when available.
 */
export function writeKvcachedSegment(name: string, usage: KvcachedUsage, shmDir = defaultShmDir()): void {
  const path = segmentPath(name, shmDir)
  if (!path) throw new Error(`invalid kvcached segment name '${name}'`)
  const fd = openSync(path, constants.O_RDWR | constants.O_CREAT, 0o666)
  try {
    withLock(fd, LOCK_EX, () => writeSegmentFd(fd, usage), { wait: false })
  } finally {
    closeSync(fd)
  }
}

/** removeKvcachedSegment deletes a (stale) segment; true when a file was removed. */
export function removeKvcachedSegment(name: string, shmDir = defaultShmDir()): boolean {
  const path = segmentPath(name, shmDir)
  if (!path) return false
  try {
    unlinkSync(path)
    return true
  } catch {
    return false
  }
}
