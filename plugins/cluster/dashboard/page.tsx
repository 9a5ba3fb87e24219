import { useEffect, useState } from 'preact/hooks'
import { type ApiError, get, id } from '../../../src/dashboard/client/api.ts'
import { ErrorNote } from '../../../src/dashboard/client/components/error-note.tsx'
import { GpuCard } from '../../../src/dashboard/client/components/gpu-bar.tsx'
import { since } from '../../../src/dashboard/client/format.ts'
import { onLive } from '../../../src/dashboard/client/live.ts'
import type { InstanceRecord, MultiGpuMemory } from '../../gateway/api.ts'
import type { ClusterStatus, Pod, RoutingTable } from '../schemas.ts'
import type { ClusterView } from './changes.ts'

/** api: the cluster's routes the page calls (a pod's GPUs and records are relayed by this pod). */
const api = {
  cluster: () => get<ClusterStatus>('/api/cluster'),
  clusterPods: () => get<{ pods: Pod[] }>('/api/cluster/pods'),
  routingTable: () => get<RoutingTable>('/api/cluster/routing-table'),
  podMemory: (podId: string) =>
    get<MultiGpuMemory & { podId: string }>(`/api/cluster/pods/${id(podId)}/memory`),
  podModels: (podId: string) =>
    get<{ models: InstanceRecord[]; podId: string }>(`/api/cluster/pods/${id(podId)}/models/full`),
}

type PodGpus = { memory: MultiGpuMemory; records: Map<string, InstanceRecord> } | { error: ApiError }

/** readGpus: a pod's memory view and instance records, relayed by this pod. */
async function readGpus(podId: string): Promise<PodGpus> {
  try {
    const [memory, models] = await Promise.all([api.podMemory(podId), api.podModels(podId)])
    return { memory, records: new Map(models.models.map((m) => [m.id, m])) }
  } catch (err) {
    return { error: err as ApiError }
  }
}

/** holding: what a pod holds, as its heartbeats say: its GPUs are read again when it changes. */
const holding = (p: Pod) =>
  p.models
    .map((m) => `${m.instanceId}:${m.status}:${m.gpuIds.join(',')}`)
    .sort()
    .join(' ')

/**
 * ClusterPage: the cluster as this pod sees it: health, leader and term, every pod (role, status,
 * last heartbeat, models), the routing table, and each pod's GPUs drawn with the same bar as the GPU
 * page (from the pod's own memory view and instance records, relayed by this pod). It reads them
 * once, then applies each view the cluster publishes on the live stream (`cluster.changed`: a
 * heartbeat heard, a pod silent, a new table or leader); a pod's GPUs are read again only when
 * what it holds changed (its models and their states). It never polls.
 */
export function ClusterPage() {
  const [view, setView] = useState<ClusterView | null>(null)
  const [gpus, setGpus] = useState<Record<string, PodGpus>>({})
  const [error, setError] = useState<ApiError | null>(null)
  useEffect(() => {
    let stopped = false
    const held = new Map<string, string>()
    /** follow reads the GPUs of each pod that is new or holds something else than when last read. */
    const follow = (pods: Pod[]) => {
      for (const p of pods) {
        const now = holding(p)
        if (held.get(p.podId) === now) continue
        held.set(p.podId, now)
        void readGpus(p.podId).then((g) => {
          if (!stopped) setGpus((all) => ({ ...all, [p.podId]: g }))
        })
      }
    }
    let pushed = false
    const apply = (v: ClusterView) => {
      setView(v)
      setError(null)
      follow(v.pods)
    }
    const off = onLive<ClusterView>('cluster.changed', (v) => {
      pushed = true
      apply(v)
    })
    Promise.all([api.cluster(), api.clusterPods(), api.routingTable()])
      .then(([status, pods, table]) => {
        if (!stopped && !pushed) apply({ status, pods: pods.pods, table })
      })
      .catch((err) => {
        if (!stopped) setError(err as ApiError)
      })
    return () => {
      stopped = true
      off()
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
        const g = gpus[p.podId]
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
