import { useState } from 'preact/hooks'
import { gib, percent } from '../format.ts'
import { gpuSegments, type Segment, widths } from '../gpu-segments.ts'
import { href } from '../router.ts'
import type { GpuHolder, GpuRow } from '../types.ts'

/**
 * GpuCard: one GPU as a stacked bar (each instance's footprint in its colour, other processes, the
 * KV pool's used, preallocated and free parts) with the figures of the segment under the pointer
 * (or under keyboard focus) shown beneath it, and a legend of what the GPU holds.
 */
export function GpuCard(props: {
  row: GpuRow
  records: ReadonlyMap<string, GpuHolder>
  utilization: number | null
}) {
  const { row, records } = props
  const bar = gpuSegments(row, records)
  const shares = widths(bar)
  const [hover, setHover] = useState<Segment | null>(null)
  const describe = (s: Segment) => {
    const head = `${s.label}: ${gib(s.gib, 2)} (${percent(s.gib, bar.total)} of ${gib(bar.total)})`
    const w = s.weightsGib
    if (s.asleep) return `${head}: held while asleep`
    if (w === undefined || w >= s.gib) return head
    return `${head}: weights and CUDA graphs ${gib(w, 2)}, KV cache and overhead ${gib(s.gib - w, 2)}`
  }
  return (
    <section class="gpu card" data-gpu={row.gpu_index} data-used-gib={bar.used} data-total-gib={bar.total}>
      <header class="gpu-head">
        <h3>
          GPU {row.gpu_index} <span class="muted">{row.name}</span>
        </h3>
        <span class="muted">
          {gib(bar.used)} used of {gib(bar.total)} · {gib(row.free_gb)} free
          {props.utilization !== null && ` · ${props.utilization}% busy`}
        </span>
      </header>
      <div class="bar">
        {bar.segments.map((s, i) => (
          <button
            type="button"
            key={s.instanceId ?? s.kind}
            class={`seg ${s.kind}${s.asleep ? ' asleep' : ''}`}
            data-kind={s.kind}
            data-instance={s.instanceId}
            data-gib={s.gib}
            title={describe(s)}
            aria-label={describe(s)}
            style={{ width: `${shares[i]}%`, ...(s.color ? { backgroundColor: s.color } : {}) }}
            onMouseEnter={() => setHover(s)}
            onFocus={() => setHover(s)}
            onClick={() => setHover(s)}
            onMouseLeave={() => setHover(null)}
            onBlur={() => setHover(null)}
          >
            {s.weightsGib !== undefined && s.gib > 0 && (
              <span
                class="weights"
                style={{
                  width: `${Math.min(100, (s.weightsGib / s.gib) * 100)}%`,
                  background: s.color ?? '',
                }}
              />
            )}
          </button>
        ))}
      </div>
      <p class="bar-detail" aria-live="polite">
        {hover ? describe(hover) : 'Point at a segment for its figures.'}
      </p>
      <ul class="legend">
        {bar.segments.map((s) => (
          <li key={s.instanceId ?? s.kind}>
            <span class={`swatch ${s.kind}`} style={s.color ? { background: s.color } : {}} />
            {s.instanceId ? <a href={href(`/models/${s.instanceId}`)}>{s.label}</a> : s.label}
            <span class="muted"> {gib(s.gib)}</span>
            {s.instanceId && records.get(s.instanceId) && (
              <span class="muted"> · {records.get(s.instanceId)?.status}</span>
            )}
          </li>
        ))}
      </ul>
    </section>
  )
}
