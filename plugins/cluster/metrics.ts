import { Gauge, type Registry } from 'prom-client'
import { METRIC_PREFIX } from '../../src/host/metrics.ts'
import type { ClusterService } from './service.ts'

/**
 * registerClusterMetrics: what this pod knows of the cluster, read from its status at scrape time
 * (no state kept twice). Summed over pods, `modelgate_cluster_is_leader` is the number of pods that
 * lead by their own clock: 0 is a cluster without a leader, more than 1 a split the fencing term
 * keeps harmless but worth seeing.
 *
 * - `modelgate_cluster_is_leader`: 1 while this pod leads.
 * - `modelgate_cluster_leader_known`: 1 while this pod hears a leader (a healthy one).
 * - `modelgate_cluster_term`: the highest term (fencing token) this pod has seen.
 * - `modelgate_cluster_pods{status}`: the pods this pod knows, by `healthy` / `unhealthy`.
 */
export function registerClusterMetrics(registry: Registry, service: Pick<ClusterService, 'status'>): void {
  if (registry.getSingleMetric(`${METRIC_PREFIX}cluster_term`)) return
  const gauge = (name: string, help: string, value: (s: ReturnType<ClusterService['status']>) => number) =>
    new Gauge({
      name: `${METRIC_PREFIX}${name}`,
      help,
      registers: [registry],
      collect() {
        this.set(value(service.status()))
      },
    })
  gauge('cluster_is_leader', 'Whether this pod leads the cluster (1) or not (0)', (s) => (s.isLeader ? 1 : 0))
  gauge('cluster_leader_known', 'Whether this pod hears a healthy leader (1) or none (0)', (s) =>
    s.leaderId !== null && s.health !== 'critical' ? 1 : 0,
  )
  gauge('cluster_term', 'Highest leader term (fencing token) this pod has seen', (s) => s.term)
  new Gauge({
    name: `${METRIC_PREFIX}cluster_pods`,
    help: 'Pods this pod knows, by health',
    labelNames: ['status'],
    registers: [registry],
    collect() {
      const s = service.status()
      this.set({ status: 'healthy' }, s.healthyPodCount)
      this.set({ status: 'unhealthy' }, s.podCount - s.healthyPodCount)
    },
  })
}
