/**
 * kvcached reads and writes kvcached's usage segments (`/dev/shm/<name>`: three little-endian int64 —
 * total, used, prealloc bytes, under flock). kvcached keeps **one segment per engine instance**
 * (`kvcached_<engine>_<pgid>` by default, exactly `KVCACHED_IPC_NAME` when set; an engine with
 * several KV cache groups adds `<name>_g<N>` for group N > 0): its start overwrites the segment with
 * `(its_total, 0, 0)` and its updates overwrite used and prealloc. Engines on one GPU share the
 * pool physically, each with its own segment, so a GPU's pool is the sum of its engines' segments.
 * Reads take a shared flock through bun:ffi when libc is at hand, without ever blocking; elsewhere
 * they read plainly (a torn read of three aligned words is harmless here).
 */
import {
  closeSync,
  constants,
  fstatSync,
  openSync,
  readdirSync,
  readSync,
  unlinkSync,
  writeSync,
} from 'node:fs'
import { join } from 'node:path'
import { LOCK_EX, LOCK_SH, withLock } from './flock.ts'

export interface KvcachedUsage {
  totalBytes: number
  usedBytes: number
  preallocBytes: number
}

export const KVCACHED_SEGMENT_BYTES = 24
const SEGMENT_PREFIX = 'modelgate'
const MAX_NAME_LENGTH = 64

/**
 * KVCACHED_GPU_UTILIZATION is kvcached's default `KVCACHED_GPU_UTILIZATION`: it never maps KV pages
 * into the last (1 − 0.95) of a device, whatever the engines' budgets say.
 */
export const KVCACHED_GPU_UTILIZATION = 0.95

/**
 * sanitizeSegmentName applies kvcached's `_sanitize_segment` to an explicit KVCACHED_IPC_NAME
 * (characters other than letters, digits, `_` and `-` become `-`, at most 64 characters), so the
 * name read here is the name the engine writes.
 */
export function sanitizeSegmentName(name: string): string {
  return name.replace(/[^A-Za-z0-9_-]/g, '-').slice(0, MAX_NAME_LENGTH)
}

/** instanceSegmentName: an instance's own segment, derived from its id (set as KVCACHED_IPC_NAME). */
export function instanceSegmentName(instanceId: string): string {
  return sanitizeSegmentName(`${SEGMENT_PREFIX}_${instanceId}`)
}

/** KVCACHED_SHM_DIR: kvcached's segment directory, fixed in its source (utils.py SHM_DIR). */
export const KVCACHED_SHM_DIR = '/dev/shm'

/**
 * defaultShmDir is where the segments are read: kvcached's /dev/shm. MODELGATE_SHM_DIR moves it for
 * tests and the simulator only (the simulated kvcached writes there, so tests need not share
 * /dev/shm); a real kvcached ignores it, so it has no use on a GPU host.
 */
export function defaultShmDir(): string {
  return process.env.MODELGATE_SHM_DIR || KVCACHED_SHM_DIR
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

/**
 * engineSegmentNames lists the segments one engine writes: `name` and its KV-cache-group segments
 * `name_g<N>` (older kvcached gives each group N > 0 its own), those that exist.
 */
export function engineSegmentNames(name: string, shmDir = defaultShmDir()): string[] {
  if (!segmentPath(name, shmDir)) return []
  let files: string[]
  try {
    files = readdirSync(shmDir)
  } catch {
    return []
  }
  return files.filter(
    (f) => f === name || (f.startsWith(`${name}_g`) && /^\d+$/.test(f.slice(name.length + 2))),
  )
}

/** readEngineUsage sums an engine's segments (null when it has none, e.g. not started yet). */
export function readEngineUsage(name: string, shmDir = defaultShmDir()): KvcachedUsage | null {
  let sum: KvcachedUsage | null = null
  for (const f of engineSegmentNames(name, shmDir)) {
    const u = readKvcachedSegment(f, shmDir)
    if (!u) continue
    sum = addUsage(sum ?? { totalBytes: 0, usedBytes: 0, preallocBytes: 0 }, u)
  }
  return sum
}

/** addUsage adds `b ÷ share` to `a` (share: the GPUs an engine's figures are split over). */
export function addUsage(a: KvcachedUsage, b: KvcachedUsage, share = 1): KvcachedUsage {
  return {
    totalBytes: a.totalBytes + b.totalBytes / share,
    usedBytes: a.usedBytes + b.usedBytes / share,
    preallocBytes: a.preallocBytes + b.preallocBytes / share,
  }
}

/** removeEngineSegments deletes an engine's (stale) segments; returns the names removed. */
export function removeEngineSegments(name: string, shmDir = defaultShmDir()): string[] {
  return engineSegmentNames(name, shmDir).filter((f) => removeKvcachedSegment(f, shmDir))
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
