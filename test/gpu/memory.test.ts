import { describe, expect, it } from 'bun:test'
import { displayNames, fnv1a, hslToHex, instanceColors, shortModelName } from '../../src/gpu/colors.ts'
import {
  chooseGpus,
  gpuAvailability,
  gpuMemoryMib,
  modelRecords,
  multiGpuMemoryView,
  otherProcessMibByGpu,
  singleMemoryView,
  sumKvUsage,
} from '../../src/gpu/memory.ts'
import type { GpuInfo } from '../../src/gpu/smi.ts'

const GIB = 2 ** 30

function gpu(
  index: number,
  totalGib: number | null,
  usedGib: number | null,
  util: number | null = 0,
): GpuInfo {
  const total = totalGib === null ? null : totalGib * 1024
  const used = usedGib === null ? null : usedGib * 1024
  return {
    index,
    uuid: `GPU-${index}`,
    name: 'NVIDIA H100 80GB HBM3',
    memoryTotalMib: total,
    memoryUsedMib: used,
    memoryFreeMib: total !== null && used !== null ? total - used : null,
    utilizationPercent: util,
    temperatureC: 40,
  }
}

describe('gpuMemoryMib', () => {
  it('derives one unknown figure from the other two', () => {
    const g = gpu(0, 80, 20)
    expect(gpuMemoryMib({ ...g, memoryFreeMib: null })).toEqual({ total: 81920, used: 20480, free: 61440 })
    expect(gpuMemoryMib({ ...g, memoryTotalMib: null })).toEqual({ total: 81920, used: 20480, free: 61440 })
    expect(gpuMemoryMib({ ...g, memoryUsedMib: null })).toEqual({ total: 81920, used: 20480, free: 61440 })
    expect(gpuMemoryMib({ ...g, memoryUsedMib: null, memoryFreeMib: null })).toEqual({
      total: 81920,
      used: null,
      free: null,
    })
  })
})

describe('gpuAvailability', () => {
  const gpus: GpuInfo[] = [
    {
      ...gpu(0, 80, 0),
      memoryTotalMib: 81559,
      memoryUsedMib: 480,
      memoryFreeMib: 81079,
      utilizationPercent: 12,
    },
    {
      ...gpu(1, 80, 0),
      memoryTotalMib: 81559,
      memoryUsedMib: 3200,
      memoryFreeMib: 78359,
      utilizationPercent: null,
    },
  ]

  it('lists every GPU and recommends the one with the most free memory', () => {
    expect(gpuAvailability(gpus, new Map([[1, 2]]))).toEqual({
      gpus: [
        {
          index: 0,
          name: 'NVIDIA H100 80GB HBM3',
          memory_total_mb: 81559,
          memory_used_mb: 480,
          memory_free_mb: 81079,
          utilization_percent: 12,
          models_loaded: 0,
          recommended: true,
        },
        {
          index: 1,
          name: 'NVIDIA H100 80GB HBM3',
          memory_total_mb: 81559,
          memory_used_mb: 3200,
          memory_free_mb: 78359,
          utilization_percent: null,
          models_loaded: 2,
          recommended: false,
        },
      ],
      recommendation: {
        gpu_id: 0,
        free_memory_gb: 79.18,
        reason: 'GPU 0 has the most free memory (79.18 GB)',
      },
    })
  })

  it('breaks ties by the lowest index and ranks unknown free memory as none', () => {
    const tied = [gpu(3, 80, 10), gpu(1, 80, 10), { ...gpu(0, null, null), memoryFreeMib: null }]
    const result = gpuAvailability(tied, new Map())
    expect(result.recommendation?.gpu_id).toBe(1)
    expect(result.gpus.map((g) => g.recommended)).toEqual([false, true, false])
    expect(result.gpus[2]).toMatchObject({
      memory_total_mb: null,
      memory_used_mb: null,
      memory_free_mb: null,
    })
    expect(result.recommendation?.reason).toBe('GPU 1 has the most free memory (70.00 GB)')
  })

  it('has no recommendation without GPUs', () => {
    expect(gpuAvailability([], new Map())).toEqual({ gpus: [], recommendation: null })
  })
})

describe('chooseGpus', () => {
  const gpus = [gpu(0, 80, 50), gpu(1, 80, 10), gpu(2, 80, 10), gpu(3, 80, 5)]

  it('takes the GPUs with the most free memory, ties by index', () => {
    expect(chooseGpus(gpus, 1).map((g) => g.index)).toEqual([3])
    expect(chooseGpus(gpus, 3).map((g) => g.index)).toEqual([3, 1, 2])
  })

  it('skips excluded GPUs and returns fewer when not enough remain', () => {
    expect(chooseGpus(gpus, 2, [3, 1]).map((g) => g.index)).toEqual([2, 0])
    expect(chooseGpus(gpus, 9, [0])).toHaveLength(3)
    expect(chooseGpus(gpus, 0)).toEqual([])
  })
})

describe('display names', () => {
  it('suffixes duplicates in order', () => {
    const names = displayNames([
      { instance_id: 'a', name: 'qwen' },
      { instance_id: 'b', name: 'llama' },
      { instance_id: 'c', name: 'qwen' },
      { instance_id: 'd', name: 'qwen' },
    ])
    expect([...names.values()]).toEqual(['qwen', 'llama', 'qwen (2)', 'qwen (3)'])
  })

  it('never repeats a label, even against a name that already has a suffix', () => {
    const names = displayNames([
      { instance_id: 'a', name: 'qwen (2)' },
      { instance_id: 'b', name: 'qwen' },
      { instance_id: 'c', name: 'qwen' },
    ])
    expect([...names.values()]).toEqual(['qwen (2)', 'qwen', 'qwen (3)'])
  })

  it('falls back to the last segment of the model path', () => {
    expect(shortModelName('Qwen/Qwen2.5-7B-Instruct')).toBe('Qwen2.5-7B-Instruct')
    expect(shortModelName('/models/llama/')).toBe('llama')
    expect(shortModelName('plain')).toBe('plain')
  })
})

describe('instance colours', () => {
  it('renders HSL as #rrggbb', () => {
    expect(hslToHex(0, 1, 0.5)).toBe('#ff0000')
    expect(hslToHex(120, 1, 0.5)).toBe('#00ff00')
    expect(hslToHex(240, 1, 0.25)).toBe('#000080')
    expect(fnv1a('a')).toBe(0xe40c292c)
  })

  it('derives a stable colour from instance_id', () => {
    const ids = ['inst-1', 'inst-2', 'inst-3']
    expect(instanceColors(ids)).toEqual(instanceColors(ids))
    for (const color of instanceColors(ids).values()) expect(color).toMatch(/^#[0-9a-f]{6}$/)
  })

  it('keeps an older instance’s colour when newer ones are added', () => {
    const before = instanceColors(['a', 'b'])
    const after = instanceColors(['a', 'b', 'c', 'd', 'e'])
    expect(after.get('a')).toBe(before.get('a')!)
    expect(after.get('b')).toBe(before.get('b')!)
  })

  it('keeps a handful of instances well apart in hue (24 degrees for 8, 12 for 12)', () => {
    const hue = (hex: string): number => {
      const [r, g, b] = [1, 3, 5].map((i) => Number.parseInt(hex.slice(i, i + 2), 16) / 255) as [
        number,
        number,
        number,
      ]
      const max = Math.max(r, g, b)
      const d = max - Math.min(r, g, b)
      const h = max === r ? ((g - b) / d) % 6 : max === g ? (b - r) / d + 2 : (r - g) / d + 4
      return (h * 60 + 360) % 360
    }
    const minGap = (n: number): number => {
      const hues = [...instanceColors(Array.from({ length: n }, (_, i) => `model-${i}`)).values()].map(hue)
      let gap = 360
      for (const [i, a] of hues.entries()) {
        for (const b of hues.slice(i + 1)) gap = Math.min(gap, Math.abs(a - b), 360 - Math.abs(a - b))
      }
      return gap
    }
    expect(minGap(8)).toBeGreaterThanOrEqual(23)
    expect(minGap(12)).toBeGreaterThanOrEqual(11)
  })

  it('gives every instance a different colour, even with many instances', () => {
    for (const n of [2, 15, 200, 2000]) {
      const ids = Array.from({ length: n }, (_, i) => `instance-${i}`)
      expect(new Set(instanceColors(ids).values()).size).toBe(n)
    }
  })
})

describe('modelRecords', () => {
  const models = [
    {
      instance_id: 'i1',
      model_path: 'Qwen/Qwen2.5-7B',
      model_name: 'qwen',
      gpu_ids: [0],
      weights_gib: 14.25,
      cuda_graph_gib: 0.95,
    },
    {
      instance_id: 'i2',
      model_path: 'Qwen/Qwen2.5-7B',
      model_name: 'qwen',
      gpu_ids: [1],
      weights_gib: 14.25,
    },
    { instance_id: 'i3', model_path: 'meta/Llama-70B', gpu_ids: [2, 3], weights_gib: 33, cuda_graph_gib: 1 },
  ]

  it('reports weights plus CUDA graphs for instances not measured, with unique names and colours', () => {
    const records = modelRecords(models)
    const r = (instance_id: string, display_name: string, gib: number, model_path = 'Qwen/Qwen2.5-7B') => ({
      model_path,
      instance_id,
      display_name,
      gpu_memory_gb: gib,
      weights_gb: gib,
    })
    expect(records.map(({ color: _c, ...r }) => r)).toEqual([
      r('i1', 'qwen', 15.2),
      r('i2', 'qwen (2)', 14.25),
      r('i3', 'Llama-70B', 68, 'meta/Llama-70B'),
    ])
    expect(new Set(records.map((r) => r.color)).size).toBe(3)
  })

  it('reports what a measured instance holds now, summed over its GPUs, beside its weights', () => {
    const asleep = { ...models[2]!, holds_gib_by_gpu: { '2': 1.5, '3': 1.25 } }
    expect(modelRecords([asleep])[0]).toMatchObject({ gpu_memory_gb: 2.75, weights_gb: 68 })
    expect(modelRecords([asleep], 'per_gpu')[0]).toMatchObject({ gpu_memory_gb: 1.5, weights_gb: 34 })
  })

  it('reports one GPU’s share in per_gpu scope', () => {
    expect(modelRecords(models, 'per_gpu')[2]?.gpu_memory_gb).toBe(34)
  })
})

describe('singleMemoryView', () => {
  const gpus = [gpu(0, 80, 20, 40), gpu(1, 80, 10, 60)]
  const models = [
    { instance_id: 'a', model_path: 'org/a', gpu_ids: [0], weights_gib: 14.25, cuda_graph_gib: 0.95 },
    { instance_id: 'b', model_path: 'org/b', gpu_ids: [0, 1], weights_gib: 7, cuda_graph_gib: 0.5 },
  ]

  it('computes the pool as GPU free + prealloc + used', () => {
    const view = singleMemoryView({ gpus, models, kv: { usedBytes: 4 * GIB, preallocBytes: 2 * GIB } })
    expect(view.kvcache).toEqual({ total_gb: 136, prealloc_gb: 2, used_gb: 4, free_gb: 130 })
    expect(view.gpu).toEqual({ total_gb: 160, used_gb: 30, free_gb: 130, utilization_percent: 50 })
    expect(view.models.map((m) => [m.display_name, m.gpu_memory_gb])).toEqual([
      ['a', 15.2],
      ['b', 15],
    ])
  })

  it('treats a missing segment as nothing in use', () => {
    expect(singleMemoryView({ gpus, models, kv: null }).kvcache).toEqual({
      total_gb: 130,
      prealloc_gb: 0,
      used_gb: 0,
      free_gb: 130,
    })
  })

  it('omits kvcache when no model is loaded', () => {
    const view = singleMemoryView({ gpus, models: [], kv: { usedBytes: GIB, preallocBytes: 0 } })
    expect('kvcache' in view).toBe(false)
    expect(view.models).toEqual([])
  })

  it('averages only the known utilizations', () => {
    const view = singleMemoryView({ gpus: [gpu(0, 80, 0, null), gpu(1, 80, 0, 30)], models: [], kv: null })
    expect(view.gpu.utilization_percent).toBe(30)
    expect(
      singleMemoryView({ gpus: [gpu(0, 80, 0, null)], models: [], kv: null }).gpu.utilization_percent,
    ).toBe(0)
  })

  it('sums several segments', () => {
    expect(
      sumKvUsage([
        { usedBytes: 1, preallocBytes: 2 },
        { usedBytes: 3, preallocBytes: 4 },
      ]),
    ).toEqual({ usedBytes: 4, preallocBytes: 6 })
  })
})

describe('multiGpuMemoryView', () => {
  const gpus = [gpu(0, 80, 40, 30), gpu(1, 80, 30, 20), gpu(2, 80, 0, 0)]
  const shared = {
    instance_id: 'shared-a',
    model_path: 'org/a',
    gpu_ids: [0],
    weights_gib: 14.25,
    cuda_graph_gib: 0.95,
    memory_baseline_by_gpu: { 0: 16 },
    sharedcache_enabled: true,
  }
  const tp2 = {
    instance_id: 'tp-b',
    model_path: 'org/b',
    gpu_ids: [0, 1],
    weights_gib: 7,
    cuda_graph_gib: 0.5,
    memory_baseline_by_gpu: new Map([
      [0, 9],
      [1, 9],
    ]),
    kv_cache_usage_perc: 0.5,
    kv_cache_available_gib: 20,
  }

  const view = multiGpuMemoryView({
    gpus,
    instances: [shared, tp2],
    otherProcessesMibByGpu: new Map([[1, 2048]]),
    kvSegmentsByGpu: new Map([[0, { usedBytes: 3 * GIB, preallocBytes: 1 * GIB }]]),
  })

  it('gives a GPU with a shared pool and a TP rank its own pool', () => {
    expect(view.gpus[0]).toMatchObject({
      gpu_index: 0,
      total_gb: 80,
      used_gb: 40,
      free_gb: 40,
      utilization_percent: 30,
      kvcache: { total_gb: 55, used_gb: 13, prealloc_gb: 1, free_gb: 41 },
    })
    // Each instance's row shows its footprint on this GPU (what the pool is computed without).
    expect(view.gpus[0]?.models.map((m) => [m.instance_id, m.gpu_memory_gb, m.weights_gb])).toEqual([
      ['shared-a', 16, 15.2],
      ['tp-b', 9, 7.5],
    ])
  })

  it('subtracts other processes and splits TP usage evenly', () => {
    expect(view.gpus[1]).toMatchObject({
      gpu_index: 1,
      kvcache: { total_gb: 69, used_gb: 10, prealloc_gb: 0, free_gb: 59 },
    })
    expect(view.gpus[1]?.models.map((m) => m.instance_id)).toEqual(['tp-b'])
  })

  it('has no pool on a GPU without models', () => {
    expect(view.gpus[2]?.models).toEqual([])
    expect(view.gpus[2] && 'kvcache' in view.gpus[2]).toBe(false)
  })

  it('sums the pools and the free memory at the top level', () => {
    expect(view.kvcache).toEqual({ total_gb: 124, used_gb: 23, prealloc_gb: 1, free_gb: 100 })
    expect(view.total_system_free_gb).toBe(170)
  })

  it('keeps display names and colours identical to the single view', () => {
    const single = modelRecords([shared, tp2])
    expect(view.gpus[0]?.models.map((m) => [m.display_name, m.color])).toEqual(
      single.map((m) => [m.display_name, m.color]),
    )
  })

  it('falls back to weights plus graphs without a baseline and never goes below zero', () => {
    const heavy = { instance_id: 'h', model_path: 'org/h', gpu_ids: [0], weights_gib: 70, cuda_graph_gib: 2 }
    const busy = { ...heavy, instance_id: 'h2', kv_cache_usage_perc: 1, kv_cache_available_gib: 30 }
    const v = multiGpuMemoryView({ gpus: [gpu(0, 80, 79)], instances: [heavy, busy] })
    expect(v.gpus[0]?.kvcache).toEqual({ total_gb: 0, used_gb: 30, prealloc_gb: 0, free_gb: 0 })
  })

  it('reports zeros at the top level with no models', () => {
    const v = multiGpuMemoryView({ gpus, instances: [] })
    expect(v.kvcache).toEqual({ total_gb: 0, used_gb: 0, prealloc_gb: 0, free_gb: 0 })
    expect(v.gpus.every((g) => !('kvcache' in g))).toBe(true)
  })
})

describe('otherProcessMibByGpu', () => {
  it('sums processes that are not our engines, per GPU index', () => {
    const gpus = [gpu(0, 80, 0), gpu(1, 80, 0)]
    const apps = [
      { pid: 100, processName: 'python3', usedMemoryMib: 70000, gpuUuid: 'GPU-0' },
      { pid: 101, processName: 'python3', usedMemoryMib: 70000, gpuUuid: 'GPU-1' },
      { pid: 555, processName: 'jupyter', usedMemoryMib: 2048, gpuUuid: 'GPU-1' },
      { pid: 556, processName: 'other', usedMemoryMib: 1024, gpuUuid: 'GPU-1' },
      { pid: null, processName: '', usedMemoryMib: 999, gpuUuid: 'GPU-0' },
      { pid: 557, processName: 'gone', usedMemoryMib: 999, gpuUuid: 'GPU-9' },
    ]
    expect(otherProcessMibByGpu(gpus, apps, new Set([100, 101]))).toEqual(new Map([[1, 3072]]))
  })
})
