import { afterAll, describe, expect, it } from 'bun:test'
import { existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { readKvcachedSegment, writeKvcachedSegment } from '../../src/gpu/kvcached.ts'
import {
  defaultIpcName,
  KvcachedSegment,
  processGroupId,
  startupGuardWarning,
} from '../../src/sim/kvcached.ts'

/**
 * The simulator's kvcached side behaves as kvcached's MemInfoTracker: one segment per engine, the
 * start overwrites it with (total, 0, 0) and updates overwrite used and prealloc.
 */
const dir = mkdtempSync(join(tmpdir(), 'modelgate-simkv-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

describe('sim kvcached segment', () => {
  it('gives each engine its own figures', () => {
    const a = KvcachedSegment.open(dir, 'eng_a', 1000, 100)
    const b = KvcachedSegment.open(dir, 'eng_b', 2000, 200)
    a.setUsed(50)
    b.setUsed(30)
    a.setUsed(20)
    expect(readKvcachedSegment('eng_a', dir)).toEqual({ totalBytes: 1000, usedBytes: 20, preallocBytes: 100 })
    expect(readKvcachedSegment('eng_b', dir)).toEqual({ totalBytes: 2000, usedBytes: 30, preallocBytes: 200 })
    expect(statSync(join(dir, 'eng_a')).size).toBe(24)
    a.remove()
    b.remove()
    expect(existsSync(join(dir, 'eng_a'))).toBe(false)
    expect(existsSync(join(dir, 'eng_b'))).toBe(false)
  })

  it("overwrites the segment at start, whatever was there (two engines given one name corrupt each other's figures)", () => {
    writeKvcachedSegment('stale', { totalBytes: 9, usedBytes: 8, preallocBytes: 7 }, dir)
    const first = KvcachedSegment.open(dir, 'stale', 1000, 100)
    expect(readKvcachedSegment('stale', dir)).toEqual({ totalBytes: 1000, usedBytes: 0, preallocBytes: 100 })
    first.setUsed(500)
    const second = KvcachedSegment.open(dir, 'stale', 3000, 300)
    expect(readKvcachedSegment('stale', dir)).toEqual({ totalBytes: 3000, usedBytes: 0, preallocBytes: 300 })
    first.setUsed(40)
    expect(readKvcachedSegment('stale', dir)).toEqual({ totalBytes: 3000, usedBytes: 40, preallocBytes: 100 })
    first.close()
    second.remove()
  })

  it('keeps a total changed by the operator (kvctl limit) on updates', () => {
    const e = KvcachedSegment.open(dir, 'limited', 1000, 100)
    writeKvcachedSegment('limited', { totalBytes: 600, usedBytes: 0, preallocBytes: 100 }, dir)
    e.setUsed(70)
    expect(readKvcachedSegment('limited', dir)).toEqual({
      totalBytes: 600,
      usedBytes: 70,
      preallocBytes: 100,
    })
    e.remove()
  })

  it('names the segment as kvcached does: exact (sanitized) KVCACHED_IPC_NAME, else kvcached_vLLM_<pgid>', () => {
    expect(defaultIpcName('modelgate_opt-125m-abc123', dir)).toBe('modelgate_opt-125m-abc123')
    expect(defaultIpcName('my pool.1', dir)).toBe('my-pool-1')
    const base = `kvcached_vLLM_${processGroupId()}`
    expect(defaultIpcName(undefined, dir)).toBe(base)
    writeFileSync(join(dir, base), Buffer.alloc(24))
    expect(defaultIpcName(undefined, dir)).toBe(`${base}_1`)
    const seg = KvcachedSegment.open(dir, 'my pool.1', 1, 0)
    expect(existsSync(join(dir, 'my-pool-1'))).toBe(true)
    seg.remove()
  })

  it("words the start-up guard warning as kvcached's vLLM patch does", () => {
    expect(startupGuardWarning(4 * 2 ** 30, 72 * 2 ** 30, new Date(2026, 7, 21, 9, 5, 3))).toBe(
      "[kvcached][WARNING][2026-08-21 09:05:03][patches.py:1936] Ignoring vLLM's whole-device startup memory " +
        'guard because kvcached provides virtual KV capacity: free=4294967296 bytes, requested=77309411328 bytes',
    )
  })
})
