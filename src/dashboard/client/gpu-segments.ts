import type { GpuHolder, GpuRow } from './types.ts'

/**
 * gpuSegments splits one GPU's memory into the bar the GPU view draws, from the multi-GPU view's
 * own figures so the bar and the API agree: what each instance holds on this GPU now (the view's
 * `gpu_memory_gb`, the gateway's one figure of it, measured in its current state: a sleeping
 * instance shows what it keeps asleep, not what it will take back), other processes,
 * then the shared KV pool (used, preallocated, free). The view defines the pool as
 * total − footprints − other processes, so other processes = total − pool − footprints. There is a
 * pool only where the shared cache is on: a GPU one of whose instances takes its KV cache from it
 * (`sharedcache_enabled`). Elsewhere each engine's KV cache is inside its footprint, and what the
 * view calls the pool is free memory: other processes = used − footprints, the rest is free.
 */
export type SegmentKind = 'instance' | 'other' | 'kv-used' | 'kv-prealloc' | 'kv-free' | 'free'

export interface Segment {
  kind: SegmentKind
  label: string
  gib: number
  /** The instance's colour (instance segments). */
  color?: string
  instanceId?: string
  /** Of an instance's footprint, its weights and CUDA graphs (the rest: KV cache and overhead). */
  weightsGib?: number
  /** The instance sleeps: its figure is what it holds asleep (its weights are in host memory or gone). */
  asleep?: boolean
}

export interface GpuBar {
  total: number
  used: number
  segments: Segment[]
}

/** Figures below this (GiB) are rounding noise between the view's rounded numbers: not drawn. */
const NOISE_GIB = 0.05

export function gpuSegments(row: GpuRow, records: ReadonlyMap<string, GpuHolder>): GpuBar {
  const total = row.total_gb ?? 0
  const used = row.used_gb ?? 0
  const segments: Segment[] = row.models.map((m) => ({
    kind: 'instance',
    label: records.get(m.instance_id)?.status === 'sleeping' ? `${m.display_name} (asleep)` : m.display_name,
    asleep: records.get(m.instance_id)?.status === 'sleeping',
    gib: m.gpu_memory_gb,
    color: m.color,
    instanceId: m.instance_id,
    // Asleep, the weights are no longer on the GPU: the figure is all there is to draw.
    ...(records.get(m.instance_id)?.status === 'sleeping'
      ? {}
      : { weightsGib: Math.min(m.weights_gb, m.gpu_memory_gb) }),
  }))
  const footprints = segments.reduce((a, s) => a + s.gib, 0)
  const pooled = row.models.some((m) => records.get(m.instance_id)?.sharedcache_enabled === true)
  if (row.kvcache && pooled) {
    const kv = row.kvcache
    segments.push(
      { kind: 'other', label: 'Other processes', gib: Math.max(0, total - kv.total_gb - footprints) },
      { kind: 'kv-used', label: 'KV cache in use', gib: kv.used_gb },
      { kind: 'kv-prealloc', label: 'KV cache preallocated', gib: kv.prealloc_gb },
      { kind: 'kv-free', label: 'KV pool free', gib: kv.free_gb },
    )
  } else {
    segments.push(
      { kind: 'other', label: 'Other processes', gib: Math.max(0, used - footprints) },
      { kind: 'free', label: 'Free', gib: Math.max(0, row.free_gb ?? total - used) },
    )
  }
  return { total, used, segments: segments.filter((s) => s.kind === 'instance' || s.gib >= NOISE_GIB) }
}

/** widths: each segment's share of the bar in percent, scaled down when the figures overrun the total. */
export function widths(bar: GpuBar): number[] {
  const sum = bar.segments.reduce((a, s) => a + s.gib, 0)
  const scale = Math.max(bar.total, sum) || 1
  return bar.segments.map((s) => (s.gib / scale) * 100)
}
