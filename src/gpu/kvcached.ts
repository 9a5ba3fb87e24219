/**
 * kvcached reads and writes the shared-KV-cache usage segment (`/dev/shm/<name>`: three little-endian
 * int64 — total, used, prealloc bytes). It is where the memory views get the pool's used and
 * preallocated figures, and the gateway rewrites it when an exiting engine removed a segment other
 * engines still use. Reads take a shared flock through bun:ffi when libc is at hand, without ever
 * blocking; elsewhere they read plainly (a torn read of three aligned words is harmless here).
 */
import { dlopen, FFIType } from 'bun:ffi'
import { closeSync, constants, openSync, readSync, unlinkSync, writeSync } from 'node:fs'
import { join } from 'node:path'

export interface KvcachedUsage {
  totalBytes: number
  usedBytes: number
  preallocBytes: number
}

export const KVCACHED_SEGMENT_BYTES = 24
const SEGMENT_PREFIX = 'modelgate'
const LOCK_SH = 1
const LOCK_EX = 2
const LOCK_NB = 4
const LOCK_UN = 8
const LOCK_ATTEMPTS = 20

/** sharedCacheSegmentName names a pool after its GPU set, so engines on the same GPUs share it. */
export function sharedCacheSegmentName(gpuIds: readonly number[]): string {
  const ids = [...new Set(gpuIds)].sort((a, b) => a - b)
  return `${SEGMENT_PREFIX}_GPU${ids.join('_')}`
}

export function defaultShmDir(): string {
  return process.env.MODELGATE_SHM_DIR ?? '/dev/shm'
}

type Flock = (fd: number, op: number) => number
let flockFn: Flock | null | undefined

/** loadFlock binds libc's flock once; null where bun:ffi or libc is unavailable. */
function loadFlock(): Flock | null {
  if (flockFn !== undefined) return flockFn
  flockFn = null
  for (const lib of ['libc.so.6', 'libc.dylib']) {
    try {
      const { symbols } = dlopen(lib, { flock: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 } })
      flockFn = (fd, op) => symbols.flock(fd, op)
      break
    } catch {
      // not this platform's libc; try the next name, else read without a lock
    }
  }
  return flockFn
}

/** tryLock takes a non-blocking flock with a few retries; false means "go on without it". */
function tryLock(fd: number, op: number): boolean {
  const flock = loadFlock()
  if (!flock) return false
  for (let i = 0; i < LOCK_ATTEMPTS; i++) {
    if (flock(fd, op | LOCK_NB) === 0) return true
  }
  return false
}

function unlock(fd: number, locked: boolean): void {
  if (locked) loadFlock()?.(fd, LOCK_UN)
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
    const locked = tryLock(fd, LOCK_SH)
    const buf = Buffer.alloc(KVCACHED_SEGMENT_BYTES)
    let n = 0
    try {
      n = readSync(fd, buf, 0, KVCACHED_SEGMENT_BYTES, 0)
    } finally {
      unlock(fd, locked)
    }
    if (n < KVCACHED_SEGMENT_BYTES) return null
    return {
      totalBytes: Number(buf.readBigInt64LE(0)),
      usedBytes: Number(buf.readBigInt64LE(8)),
      preallocBytes: Number(buf.readBigInt64LE(16)),
    }
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
  const buf = Buffer.alloc(KVCACHED_SEGMENT_BYTES)
  buf.writeBigInt64LE(BigInt(Math.trunc(usage.totalBytes)), 0)
  buf.writeBigInt64LE(BigInt(Math.trunc(usage.usedBytes)), 8)
  buf.writeBigInt64LE(BigInt(Math.trunc(usage.preallocBytes)), 16)
  const fd = openSync(path, constants.O_RDWR | constants.O_CREAT, 0o666)
  try {
    const locked = tryLock(fd, LOCK_EX)
    try {
      writeSync(fd, buf, 0, KVCACHED_SEGMENT_BYTES, 0)
    } finally {
      unlock(fd, locked)
    }
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
