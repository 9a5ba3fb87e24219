import { ViewPublisher } from '../../src/dashboard/publisher.ts'
import { definePlugin } from '../../src/host/plugin.ts'
import type { BenchmarksApi } from '../benchmarks/api.ts'
import type { GatewayPodApi } from '../gateway/api.ts'
import { ClusterConfig, clusterProblems, podIdOf } from './config.ts'
import { createCoordinator } from './coordination/index.ts'
import stateSql from './db/migrations/0001_cluster_state.sql' with { type: 'text' }
import { fleetInternalRoutes } from './fleet/internal-routes.ts'
import { fleetRoutes } from './fleet/routes.ts'
import { ClusterFleet } from './fleet/service.ts'
import { ClusterHop, hopRoutes } from './hop.ts'
import { internalRoutes } from './internal-routes.ts'
import { clusterUsageRoutes, KeySync, keyInternalRoutes } from './keys.ts'
import { registerClusterMetrics } from './metrics.ts'
import { moveInternalRoutes } from './move/internal-routes.ts'
import { clusterMoveRoutes } from './move/routes.ts'
import { ClusterMoves } from './move/service.ts'
import { PeerClient } from './peer-client.ts'
import { placementRoutes, presetSyncInternalRoutes } from './placement/routes.ts'
import { PresetPlacement } from './placement/service.ts'
import { remoteInternalRoutes } from './remote/internal-routes.ts'
import { remoteRoutes } from './remote/routes.ts'
import { RemoteLifecycle } from './remote/service.ts'
import { ClusterStateRepo } from './repo.ts'
import { RevocationSync, revocationRoutes } from './revocations.ts'
import { clusterRoutes } from './routes.ts'
import { ClusterSenders } from './senders.ts'
import { ClusterService } from './service.ts'
import { InternalVerifier } from './signing.ts'

/**
 * The cluster plugin: several gateway pods, one leader named by a coordination service (etcd or a
 * Kubernetes Lease; static YAML for two hosts without one), a routing table the leader builds, and
 * the HMAC-signed internal API the pods talk over.
 */
export default definePlugin<typeof ClusterConfig, ClusterService>({
  id: 'cluster',
  description:
    'Joins several gateway pods: leader from etcd or a Kubernetes Lease, routing table, signed internal API.',
  dependsOn: ['gateway'],
  config: ClusterConfig,
  // Its page on the host's dashboard, fed by the view it publishes on change (dashboard/changes.ts).
  dashboard: {
    client: `${import.meta.dir}/dashboard/client.ts`,
    pages: [{ id: 'cluster', title: 'Cluster', nav: 'Cluster', path: '/cluster' }],
    events: ['cluster.changed'],
  },
  migrations: [{ id: 'cluster_0001_state', sql: stateSql }],
  // The secret, the coordination's URLs and timings, the static leader: refused before setup runs.
  validate: clusterProblems,
  setup(ctx, cfg) {
    const auth = ctx.config.auth
    const podId = podIdOf(cfg, process.env)
    const log = ctx.log.child('cluster')
    const repo = new ClusterStateRepo(ctx.store.db)
    let service: ClusterService | null = null
    const peers = new PeerClient({
      secret: auth.cluster_secret as string,
      podId,
      term: () => service?.fence.term ?? 0,
      timeoutMs: cfg.request_timeout_ms,
      log,
    })
    const address = () => cfg.advertise_address ?? ctx.mainUrl()
    const gateway = ctx.api<GatewayPodApi>('gateway')
    const changes = new ViewPublisher(ctx.bus, 'cluster.changed', () => ({
      status: cluster.status(),
      pods: cluster.pods(),
      table: cluster.routingTable(),
    }))
    service = new ClusterService({
      cfg,
      podId,
      address,
      coordinator: (addr) =>
        createCoordinator(cfg, { podId, address: addr, log: log.child(cfg.coordination.kind) }),
      peers,
      gateway,
      bus: ctx.bus,
      log,
      repo,
      changed: () => changes.nudge(),
    })
    // Who may send internal requests: current members, from their own addresses (senders.ts).
    const senders = new ClusterSenders({
      members: service.members,
      checkAddress: cfg.check_source_address,
      log: log.child('senders'),
    })
    ctx.auth.useInternalVerifier(
      new InternalVerifier({
        podId,
        secrets: [auth.cluster_secret as string, auth.cluster_secret_previous].filter(
          (s): s is string => typeof s === 'string' && s.length > 0,
        ),
        rateLimit: cfg.internal_rate_limit,
        unlimitedPrefixes: ['/internal/v1/'],
        senders: (pod, peer) => senders.check(pod, peer),
      }),
    )
    const cluster = service
    registerClusterMetrics(ctx.metrics, cluster)
    const hop = new ClusterHop({
      cluster,
      inference: gateway.inference,
      directory: ctx.directory,
      secret: auth.cluster_secret as string,
      metrics: ctx.metrics,
      log: log.child('hop'),
    })
    const remote = new RemoteLifecycle({ cluster, gateway, peers, timeoutMs: cfg.request_timeout_ms })
    const moves = new ClusterMoves({
      cluster,
      gateway,
      peers,
      bus: ctx.bus,
      log: log.child('move'),
      timeouts: { requestMs: cfg.request_timeout_ms },
    })
    const fleet = new ClusterFleet({
      cluster,
      gateway,
      benchmarks: () => ctx.optionalApi<BenchmarksApi>('benchmarks'),
      peers,
      version: ctx.version,
      timeoutMs: cfg.request_timeout_ms,
    })
    const placement = new PresetPlacement({
      cluster,
      gateway,
      remote,
      peers,
      bus: ctx.bus,
      log: log.child('presets'),
      timeoutMs: cfg.request_timeout_ms,
    })
    const revocations = new RevocationSync({
      keeper: ctx.auth.revocations,
      peers,
      others: () => cluster.members.peers(),
      bus: ctx.bus,
      log: log.child('logouts'),
      timeoutMs: cfg.request_timeout_ms,
    })
    const keys = new KeySync({
      keys: ctx.auth.keys,
      podId,
      peers,
      others: () => cluster.members.peers(),
      isLeader: () => cluster.lead().isLeader,
      bus: ctx.bus,
      log: log.child('keys'),
      timeoutMs: cfg.request_timeout_ms,
    })
    const usagePods = { podId, others: () => cluster.members.peers() }
    return {
      routes: clusterRoutes(cluster)
        .use(internalRoutes(cluster))
        .use(remoteRoutes(remote))
        .use(remoteInternalRoutes(gateway, cluster.fence))
        .use(clusterMoveRoutes(moves))
        .use(moveInternalRoutes(moves, cluster.fence))
        .use(fleetRoutes(fleet))
        .use(fleetInternalRoutes(fleet, cluster.fence))
        .use(placementRoutes(placement))
        .use(presetSyncInternalRoutes((p) => gateway.presets.sync(p), cluster.fence))
        .use(revocationRoutes(ctx.auth.revocations))
        .use(keyInternalRoutes(ctx.auth.keys))
        .use(clusterUsageRoutes(ctx.auth.keys, usagePods, peers, cfg.request_timeout_ms))
        .use(hopRoutes()),
      rawRoutes: hop.rawRoutes,
      api: cluster,
      start: async () => {
        await cluster.start()
        senders.start()
        await revocations.start()
        await keys.start()
        hop.start()
        placement.start()
      },
      stop: async (deadline) => {
        changes.stop()
        await revocations.stop(deadline)
        await keys.stop(deadline)
        await placement.stop()
        await moves.stop(deadline)
        hop.stop()
        senders.stop()
        await cluster.stop(deadline)
      },
    }
  },
})
