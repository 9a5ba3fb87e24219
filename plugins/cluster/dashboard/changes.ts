import type { ClusterStatus, Pod, RoutingTable } from '../schemas.ts'

/** ClusterView: what the dashboard's Cluster page draws of the cluster, in one event. */
export interface ClusterView {
  status: ClusterStatus
  pods: Pod[]
  table: RoutingTable
}

declare module '../../../src/host/bus.ts' {
  interface BusEvents {
    /**
     * cluster.changed: this pod's view of the cluster ({status, pods, table}, as GET /api/cluster,
     * /api/cluster/pods and /api/cluster/routing-table answer) after something changed it: a peer
     * heard, a pod joined, left or went silent, a new table, leader or local instance. The
     * dashboard's live stream relays it.
     */
    'cluster.changed': ClusterView
  }
}
