import { Elysia, t } from 'elysia'
import { notFound } from '../../src/http/errors.ts'
import { ControllerError } from '../../src/http/schemas.ts'
import { ClusterStatusSchema, PodModelSchema, PodSchema, RoutingTableSchema } from './schemas.ts'
import type { ClusterService } from './service.ts'

/** clusterRoutes: the read views of the cluster API (admin JWT). */
const tags = ['cluster']

export function clusterRoutes(cluster: ClusterService) {
  return new Elysia({ name: 'cluster-routes' })
    .get('/api/cluster', () => cluster.status(), {
      response: { 200: ClusterStatusSchema, 401: ControllerError, 403: ControllerError },
      detail: {
        tags,
        summary: 'Cluster status',
        description:
          'Leader and term as the coordination service (etcd, a Kubernetes Lease, or static YAML) reports them; ' +
          '`isLeader` is this pod leading now. health: healthy (every pod heard within the last ' +
          'unhealthy_after_missed heartbeats, at least expected_size pods, the leader heard), degraded (some ' +
          'pod silent, fewer than expected, or no leader heard), critical (no pod healthy).',
      },
    })
    .get('/api/cluster/pods', () => ({ pods: cluster.pods() }), {
      response: { 200: t.Object({ pods: t.Array(PodSchema) }), 401: ControllerError, 403: ControllerError },
      detail: {
        tags,
        summary: 'Every pod this pod knows, with its GPUs and models as it last reported them',
      },
    })
    .get(
      '/api/cluster/pods/:podId/models',
      ({ params }) => {
        const pod = cluster.pods().find((p) => p.podId === params.podId)
        if (!pod) throw notFound(`No pod '${params.podId}' in the cluster`, 'POD_NOT_FOUND')
        return { models: pod.models }
      },
      {
        params: t.Object({ podId: t.String() }),
        response: {
          200: t.Object({ models: t.Array(PodModelSchema) }),
          401: ControllerError,
          403: ControllerError,
          404: ControllerError,
        },
        detail: { tags, summary: "A pod's models as it last reported them (its heartbeat or event)" },
      },
    )
    .get('/api/cluster/routing-table', () => cluster.routingTable(), {
      response: { 200: RoutingTableSchema, 401: ControllerError, 403: ControllerError },
      detail: {
        tags,
        summary: 'The routing table this pod routes /v1 with',
        description:
          'Built by the leader from the healthy pods and sent with its heartbeats; a pod adopts a table only when ' +
          'it is newer and not from a lower term than one it has seen. Without a leader a pod keeps the last one.',
      },
    })
}
