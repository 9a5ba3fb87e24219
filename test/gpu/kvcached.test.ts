import { afterAll, describe, expect, it } from 'bun:test'
import { existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  engineSegmentNames,
  instanceSegmentName,
  readEngineUsage,
  readKvcachedSegment,
  removeEngineSegments,
  removeKvcachedSegment,
  sanitizeSegmentName,
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
    writeKvcachedSegment('modelgate_one', { totalBytes: 1000, usedBytes: 200, preallocBytes: 30 }, dir)
    writeKvcachedSegment('modelgate_one', { totalBytes: 999, usedBytes: 1, preallocBytes: 2 }, dir)
    expect(statSync(join(dir, 'modelgate_one')).size).toBe(24)
    expect(readKvcachedSegment('modelgate_one', dir)).toEqual({
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

// Was: 'sharedCacheSegmentName names the pool after the sorted GPU set' — the per-GPU-set segment
// model, which is wrong: kvcached keeps one segment per engine instance.
describe('per-engine segment names', () => {
  it("names an instance's segment after its id, as kvcached will spell it", () => {
    expect(instanceSegmentName('opt-125m-a1b2c3')).toBe('modelgate_opt-125m-a1b2c3')
    expect(instanceSegmentName('opt-125m-a1b2c3')).not.toBe(instanceSegmentName('opt-125m-d4e5f6'))
    const longId = `${'x'.repeat(40)}-abcdef`
    expect(sanitizeSegmentName(instanceSegmentName(longId))).toBe(instanceSegmentName(longId))
  })

  it("sanitizes like kvcached's _sanitize_segment (other characters → '-', at most 64)", () => {
    expect(sanitizeSegmentName('my pool/v1.2')).toBe('my-pool-v1-2')
    expect(sanitizeSegmentName('a'.repeat(80))).toHaveLength(64)
  })

  it("sums an engine's segment and its KV-cache-group segments, and removes them all", () => {
    const u = (t: number, used: number, pre: number) => ({
      totalBytes: t,
      usedBytes: used,
      preallocBytes: pre,
    })
    writeKvcachedSegment('eng', u(100, 10, 1), dir)
    writeKvcachedSegment('eng_g1', u(50, 5, 2), dir)
    writeKvcachedSegment('eng_gpu', u(7, 7, 7), dir) // another engine's name, not a group
    writeKvcachedSegment('eng2', u(7, 7, 7), dir)
    expect(engineSegmentNames('eng', dir).sort()).toEqual(['eng', 'eng_g1'])
    expect(readEngineUsage('eng', dir)).toEqual(u(150, 15, 3))
    expect(readEngineUsage('nothing', dir)).toBeNull()
    expect(removeEngineSegments('eng', dir).sort()).toEqual(['eng', 'eng_g1'])
    expect(readEngineUsage('eng', dir)).toBeNull()
    expect(readKvcachedSegment('eng_gpu', dir)).toEqual(u(7, 7, 7))
    expect(readKvcachedSegment('eng2', dir)).toEqual(u(7, 7, 7))
  })
})
