import { ErrorNote } from '../../../../../src/dashboard/client/components/error-note.tsx'
import { GpuCard } from '../../../../../src/dashboard/client/components/gpu-bar.tsx'
import { gib } from '../../../../../src/dashboard/client/format.ts'
import { gpus, instances, memory, viewsError } from '../live.ts'

/** GpusPage, the home page: every GPU's memory at a glance, kept live by the event stream. */
export function GpusPage() {
  const view = memory.value
  const utilization = new Map((gpus.value?.gpus ?? []).map((g) => [g.index, g.utilization_percent]))
  // The KV pool exists only where the shared cache is on (an instance takes its KV cache from it).
  const pooled = [...instances.value.values()].some((i) => i.sharedcache_enabled)
  const kv = pooled ? view?.kvcache : undefined
  return (
    <div class="page">
      <ErrorNote error={viewsError.value} />
      {view && (
        <div class="summary">
          <div class="stat">
            <span class="stat-value">{gib(view.total_system_free_gb)}</span>
            <span class="stat-label">free on {view.gpus.length} GPUs</span>
          </div>
          <div class="stat">
            <span class="stat-value">{instances.value.size}</span>
            <span class="stat-label">instances</span>
          </div>
          {kv && kv.total_gb > 0 && (
            <div class="stat">
              <span class="stat-value">{gib(kv.total_gb)}</span>
              <span class="stat-label">
                KV pool · {gib(kv.used_gb)} used · {gib(kv.prealloc_gb)} prealloc · {gib(kv.free_gb)} free
              </span>
            </div>
          )}
        </div>
      )}
      {!view && !viewsError.value && <p class="muted">Reading the GPUs…</p>}
      <div class="gpus">
        {view?.gpus.map((row) => (
          <GpuCard
            key={row.gpu_index}
            row={row}
            records={instances.value}
            utilization={utilization.get(row.gpu_index) ?? row.utilization_percent}
          />
        ))}
      </div>
    </div>
  )
}
