import { describe, expect, it } from 'bun:test'
import type { GpuRow, InstanceRecord } from '../../plugins/gateway/dashboard/client/types.ts'
import { splitArgs, tick } from '../../src/dashboard/client/format.ts'
import { gpuSegments, widths } from '../../src/dashboard/client/gpu-segments.ts'

/** The dashboard's pure parts: the GPU bar's arithmetic and the extra-arguments splitter. */
const row = (over: Partial<GpuRow> = {}): GpuRow => ({
  gpu_index: 0,
  name: 'NVIDIA H100 80GB HBM3',
  total_gb: 80,
  used_gb: 60,
  free_gb: 20,
  utilization_percent: 0,
  models: [
    {
      model_path: 'a/A',
      instance_id: 'a',
      display_name: 'A',
      gpu_memory_gb: 30,
      weights_gb: 10,
      color: '#112233',
    },
    {
      model_path: 'b/B',
      instance_id: 'b',
      display_name: 'B',
      gpu_memory_gb: 15,
      weights_gb: 5,
      color: '#445566',
    },
  ],
  kvcache: { total_gb: 30, prealloc_gb: 2, used_gb: 8, free_gb: 20 },
  ...over,
})
/** records: the instances' records (status, shared cache), taking their KV cache from the shared pool unless `pooled` is false. */
const records = (ids: string[], pooled = true, status = 'active') =>
  new Map(ids.map((id) => [id, { id, status, sharedcache_enabled: pooled } as unknown as InstanceRecord]))

describe('the GPU bar', () => {
  it('draws what each instance holds, the other processes and the KV pool, adding up to the GPU', () => {
    const bar = gpuSegments(row(), records(['a', 'b']))
    expect(bar.segments.map((s) => [s.kind, s.gib])).toEqual([
      ['instance', 30],
      ['instance', 15],
      ['other', 5],
      ['kv-used', 8],
      ['kv-prealloc', 2],
      ['kv-free', 20],
    ])
    expect(bar.segments.reduce((a, s) => a + s.gib, 0)).toBe(80)
    expect(bar.segments[0]).toMatchObject({ color: '#112233', instanceId: 'a', weightsGib: 10 })
    expect(widths(bar).reduce((a, w) => a + w, 0)).toBeCloseTo(100, 6)
  })

  it("draws the view's own figure for each instance (one source: the gateway's), not a record's", () => {
    const stale = new Map([
      ['a', { id: 'a', status: 'active', sharedcache_enabled: true, memory_baseline_by_gpu: { '0': 70 } }],
    ]) as unknown as Map<string, InstanceRecord>
    const bar = gpuSegments(row(), stale)
    expect(bar.segments.find((s) => s.instanceId === 'a')!.gib).toBe(30)
  })

  it('draws a sleeping instance as what it holds asleep, without a weights part', () => {
    const asleep = row({
      used_gb: 20,
      free_gb: 60,
      models: [
        {
          model_path: 'a/A',
          instance_id: 'a',
          display_name: 'A',
          gpu_memory_gb: 3,
          weights_gb: 10,
          color: '#112233',
        },
      ],
    })
    const [a, ...rest] = gpuSegments(asleep, records(['a'], false, 'sleeping')).segments
    expect(a).toMatchObject({ label: 'A (asleep)', asleep: true, gib: 3 })
    expect(a!.weightsGib).toBeUndefined()
    expect(rest.map((s) => [s.kind, s.gib])).toEqual([
      ['other', 17],
      ['free', 60],
    ])
  })

  it('draws no KV pool where the shared cache is off: footprints, other processes and free memory', () => {
    // The view still reports a "pool" (total − footprints − others): without the shared cache it is free memory.
    const bar = gpuSegments(row(), records(['a', 'b'], false))
    expect(bar.segments.map((s) => [s.kind, s.gib])).toEqual([
      ['instance', 30],
      ['instance', 15],
      ['other', 15],
      ['free', 20],
    ])
    expect(bar.segments.reduce((a, s) => a + s.gib, 0)).toBe(80)
  })

  it('shows a GPU without instances as other processes and free memory', () => {
    const bar = gpuSegments(row({ models: [], kvcache: undefined, used_gb: 1.5, free_gb: 78.5 }), new Map())
    expect(bar.segments.map((s) => [s.kind, s.gib])).toEqual([
      ['other', 1.5],
      ['free', 78.5],
    ])
  })

  it('leaves out rounding noise and scales the bar down when the figures overrun the GPU', () => {
    const bar = gpuSegments(
      row({ kvcache: { total_gb: 35, prealloc_gb: 0.01, used_gb: 40, free_gb: 0 } }),
      records(['a', 'b']),
    )
    expect(bar.segments.map((s) => s.kind)).toEqual(['instance', 'instance', 'kv-used'])
    const w = widths(bar)
    expect(w.reduce((a, x) => a + x, 0)).toBeCloseTo(100, 6)
    expect(w[2]! / w[0]!).toBeCloseTo(40 / 30, 6)
  })
})

describe('chart ticks', () => {
  it('keep three significant digits, so small figures do not all read 0', () => {
    expect([0, 0.0005, 0.001, 0.0015, 0.002].map(tick)).toEqual(['0', '0.0005', '0.001', '0.0015', '0.002'])
    expect([0.25, 0.5, 1, 12.5, 999].map(tick)).toEqual(['0.25', '0.5', '1', '12.5', '999'])
    expect(tick(1_234_567)).toBe('1,234,567')
    expect(tick(-0.125)).toBe('-0.125')
  })
})

describe('splitArgs', () => {
  it('splits on blanks and keeps quoted parts whole', () => {
    expect(splitArgs(`  --dtype bfloat16 --x="a b" 'c d' --empty ""  `)).toEqual([
      '--dtype',
      'bfloat16',
      '--x=a b',
      'c d',
      '--empty',
      '',
    ])
    expect(splitArgs('')).toEqual([])
  })
})
