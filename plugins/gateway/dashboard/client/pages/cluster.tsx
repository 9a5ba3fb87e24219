import { useEffect, useState } from 'preact/hooks'
import { type ApiError, api } from '../api.ts'
import { ErrorNote } from '../components/error-note.tsx'
import { GpuCard } from '../components/gpu-bar.tsx'
import { since } from '../format.ts'
import type { Page } from '../page.ts'
import type { ClusterStatus, InstanceRecord, MultiGpu, Pod, RoutingTable } from '../types.ts'

/**
 * ClusterPage: the cluster as this pod sees it: health, leader and term, every pod (role, status,
 * last heartbeat, models), the routing table, and each pod's GPUs drawn with the same bar as the GPU
 * page (from the pod's own memory view and instance records, relayed by this pod). Refreshed every
 * 5 s, the pods' heartbeat interval: nothing it shows changes faster than the pods report it.
 */
const REFRESH_MS = 5000

interface View {
  status: ClusterStatus
  pods: Pod[]
  table: RoutingTable
  gpus: Record<string, { memory: MultiGpu; records: Map<string, InstanceRecord> } | { error: ApiError }>
}

async function read(): Promise<View> {
  const [status, pods, table] = await Promise.all([api.cluster(), api.clusterPods(), api.routingTable()])
  const gpus: View['gpus'] = {}
  await Promise.all(
    pods.pods.map(async (p) => {
      try {
        const [memory, models] = await Promise.all([api.podMemory(p.podId), api.podModels(p.podId)])
        gpus[p.podId] = { memory, records: new Map(models.models.map((m) => [m.id, m])) }
      } catch (err) {
        gpus[p.podId] = { error: err as ApiError }
      }
    }),
  )
  return { status, pods: pods.pods, table, gpus }
}

function ClusterPage() {
  const [view, setView] = useState<View | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  useEffect(() => {
    let stopped = false
    let timer: ReturnType<typeof setTimeout> | undefined
    const tick = async () => {
      try {
        const v = await read()
        if (!stopped) {
          setView(v)
          setError(null)
        }
      } catch (err) {
        if (!stopped) setError(err as ApiError)
      }
      if (!stopped) timer = setTimeout(tick, REFRESH_MS)
    }
    void tick()
    return () => {
      stopped = true
      clearTimeout(timer)
    }
  }, [])
  if (!view) return error ? <ErrorNote error={error} /> : <p class="muted">Reading the cluster…</p>
  const s = view.status
  return (
    <div class="page cluster">
      <ErrorNote error={error} />
      <div class="summary">
        <div class="stat" data-health={s.health}>
          <span class={`stat-value health-${s.health}`}>{s.health}</span>
          <span class="stat-label">
            {s.healthyPodCount}/{s.podCount} pods healthy (expected {s.expectedSize})
          </span>
        </div>
        <div class="stat" data-leader={s.leaderId ?? ''}>
          <span class="stat-value">{s.leaderId ?? 'no leader'}</span>
          <span class="stat-label">
            leader · term {s.term} · {s.coordination}
          </span>
        </div>
        <div class="stat">
          <span class="stat-value">{s.totalModelsLoaded}</span>
          <span class="stat-label">
            models on {s.totalGpus} GPUs · table v{s.routingTableVersion}
          </span>
        </div>
      </div>
      <section class="card">
        <h2>Pods</h2>
        <table class="pods">
          <thead>
            <tr>
              <th>Pod</th>
              <th>Role</th>
              <th>Status</th>
              <th>Last heartbeat</th>
              <th>Models</th>
            </tr>
          </thead>
          <tbody>
            {view.pods.map((p) => (
              <tr key={p.podId} data-pod={p.podId} data-role={p.role} data-status={p.status}>
                <td>
                  {p.podId} {p.podId === s.localPodId && <span class="muted small">(this pod)</span>}
                  <div class="muted small">{p.address}</div>
                </td>
                <td>{p.role}</td>
                <td class={`status-${p.status}`}>{p.status}</td>
                <td title={p.lastHeartbeat ?? ''}>{p.lastHeartbeat ? since(p.lastHeartbeat) : '—'}</td>
                <td>{p.models.map((m) => `${m.modelName} (${m.status})`).join(', ') || '—'}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </section>
      <section class="card">
        <h2>Routing table</h2>
        <table class="routing">
          <thead>
            <tr>
              <th>Model</th>
              <th>Pods</th>
            </tr>
          </thead>
          <tbody>
            {Object.keys(view.table.entries).length === 0 && (
              <tr>
                <td colSpan={2} class="muted">
                  No model is served anywhere.
                </td>
              </tr>
            )}
            {Object.entries(view.table.entries)
              .sort(([a], [b]) => a.localeCompare(b))
              .map(([model, list]) => (
                <tr key={model} data-route={model}>
                  <td>{model}</td>
                  <td>
                    {list
                      .map((e) => `${e.podId}:${e.vllmPort}${e.weight === 0 ? ' (sleeping)' : ''}`)
                      .join(', ')}
                  </td>
                </tr>
              ))}
          </tbody>
        </table>
        <p class="muted small">
          v{view.table.version}, built by {view.table.builtBy ?? '—'} under term {view.table.term}
        </p>
      </section>
      {view.pods.map((p) => {
        const g = view.gpus[p.podId]
        return (
          <section class="card" key={p.podId} data-pod-gpus={p.podId}>
            <h2>GPUs of {p.podId}</h2>
            {!g && <p class="muted">Not read.</p>}
            {g && 'error' in g && <ErrorNote error={g.error} />}
            {g && 'memory' in g && (
              <div class="gpus">
                {g.memory.gpus.map((row) => (
                  <GpuCard
                    key={row.gpu_index}
                    row={row}
                    records={g.records}
                    utilization={row.utilization_percent}
                  />
                ))}
              </div>
            )}
          </section>
        )
      })}
    </div>
  )
}

export const clusterPage: Page = {
  id: 'cluster',
  title: 'Cluster',
  nav: 'Cluster',
  path: '/cluster',
  component: ClusterPage,
  requires: 'cluster',
}
