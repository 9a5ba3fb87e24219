import { afterAll, describe, expect, it } from 'bun:test'
import { existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  readKvcachedSegment,
  removeKvcachedSegment,
  sharedCacheSegmentName,
  writeKvcachedSegment,
} from '../../src/gpu/kvcached.ts'

const dir = mkdtempSync(join(tmpdir(), 'modelgate-kvcached-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

const GIB = 2 ** 30

describe('kvcached usage segment', () => {
  it('reads three little-endian int64 written by an engine', () => {
    const buf = Buffer.alloc(24)
    buf.writeBigInt64LE(BigInt(60 * GIB), 0)
    buf.writeBigInt64LE(BigInt(12 * GIB), 8)
    buf.writeBigInt64LE(BigInt(3 * GIB), 16)
    writeFileSync(join(dir, 'engine_written'), buf)
    expect(readKvcachedSegment('engine_written', dir)).toEqual({
      totalBytes: 60 * GIB,
      usedBytes: 12 * GIB,
      preallocBytes: 3 * GIB,
    })
  })

  it('round-trips what the gateway writes and updates in place', () => {
    writeKvcachedSegment('modelgate_GPU0', { totalBytes: 1000, usedBytes: 200, preallocBytes: 30 }, dir)
    writeKvcachedSegment('modelgate_GPU0', { totalBytes: 999, usedBytes: 1, preallocBytes: 2 }, dir)
    expect(statSync(join(dir, 'modelgate_GPU0')).size).toBe(24)
    expect(readKvcachedSegment('modelgate_GPU0', dir)).toEqual({
      totalBytes: 999,
      usedBytes: 1,
      preallocBytes: 2,
    })
  })

  it('reads only the first 24 bytes of a page-sized segment', () => {
    const buf = Buffer.alloc(4096)
    buf.writeBigInt64LE(5n, 0)
    buf.writeBigInt64LE(6n, 8)
    buf.writeBigInt64LE(7n, 16)
    writeFileSync(join(dir, 'paged'), buf)
    expect(readKvcachedSegment('paged', dir)).toEqual({ totalBytes: 5, usedBytes: 6, preallocBytes: 7 })
  })

  it('returns null for a missing, short or badly named segment', () => {
    expect(readKvcachedSegment('missing', dir)).toBeNull()
    writeFileSync(join(dir, 'short'), Buffer.alloc(16))
    expect(readKvcachedSegment('short', dir)).toBeNull()
    expect(readKvcachedSegment('../etc/passwd', dir)).toBeNull()
    expect(() =>
      writeKvcachedSegment('a/b', { totalBytes: 0, usedBytes: 0, preallocBytes: 0 }, dir),
    ).toThrow()
  })

  it('removes a segment and reports whether one existed', () => {
    writeKvcachedSegment('stale', { totalBytes: 1, usedBytes: 0, preallocBytes: 0 }, dir)
    expect(removeKvcachedSegment('stale', dir)).toBe(true)
    expect(existsSync(join(dir, 'stale'))).toBe(false)
    expect(removeKvcachedSegment('stale', dir)).toBe(false)
  })

  it('uses MODELGATE_SHM_DIR when no directory is given', () => {
    const previous = process.env.MODELGATE_SHM_DIR
    process.env.MODELGATE_SHM_DIR = dir
    try {
      writeKvcachedSegment('from_env', { totalBytes: 8, usedBytes: 4, preallocBytes: 2 })
      expect(readKvcachedSegment('from_env')).toEqual({ totalBytes: 8, usedBytes: 4, preallocBytes: 2 })
      expect(removeKvcachedSegment('from_env')).toBe(true)
    } finally {
      if (previous === undefined) delete process.env.MODELGATE_SHM_DIR
      else process.env.MODELGATE_SHM_DIR = previous
    }
  })
})

describe('sharedCacheSegmentName', () => {
  it('names the pool after the sorted GPU set', () => {
    expect(sharedCacheSegmentName([0])).toBe('modelgate_GPU0')
    expect(sharedCacheSegmentName([1, 0])).toBe('modelgate_GPU0_1')
    expect(sharedCacheSegmentName([3, 2, 3])).toBe('modelgate_GPU2_3')
  })
})
