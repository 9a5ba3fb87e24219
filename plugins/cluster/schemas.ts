import { type Static, t } from 'elysia'

/**
 * The cluster's records as TypeBox schemas (camelCase, as every cluster API body), and the bodies
 * of the internal API. Routes validate with them, /docs
 * shows them, and the types below are derived from them.
 */

export const PodGpuSchema = t.Object({
  gpuId: t.Number(),
  name: t.String(),
  totalVramMB: t.Number(),
  usedVramMB: t.Number(),
  temperature: t.Number(),
  utilization: t.Number(),
})

export const PodModelSchema = t.Object({
  instanceId: t.String(),
  podId: t.String(),
  modelPath: t.String(),
  modelName: t.String({ description: 'the served model name (what /v1 calls it)' }),
  status: t.String({
    description:
      "the gateway's instance status; `running` for a serving instance, `standby` for one serving on its pod but out of the routing table (a cross-pod move's target before the switch, or its source after)",
  }),
  port: t.Number({ description: "the engine's port on its pod" }),
  gpuIds: t.Array(t.Number()),
  tensorParallelSize: t.Number(),
})

/** PodStateSchema: what a pod says about itself in every heartbeat, event and /internal/state. */
export const PodStateSchema = t.Object({
  podId: t.String({ minLength: 1, maxLength: 253 }),
  address: t.String({ minLength: 1, maxLength: 2048 }),
  joinedAt: t.String(),
  term: t.Number({ description: 'the highest leader term this pod has seen' }),
  routingTableVersion: t.Number(),
  models: t.Array(PodModelSchema, { maxItems: 4096 }),
  gpus: t.Array(PodGpuSchema, { maxItems: 256 }),
})

export const RoutingEntrySchema = t.Object({
  podId: t.String(),
  podAddress: t.String(),
  vllmPort: t.Number({ description: "the engine's port on that pod" }),
  weight: t.Number({ description: '1 for a running instance, 0 for a sleeping one (woken on request)' }),
})

export const RoutingTableSchema = t.Object({
  version: t.Number({ description: 'grows with every table a leader builds (across leaders too)' }),
  term: t.Number({ description: 'term of the leader that built it; a table from a lower term is refused' }),
  builtBy: t.Nullable(t.String()),
  entries: t.Record(t.String(), t.Array(RoutingEntrySchema), {
    description: 'served model name → the pods that hold it',
  }),
})

export const HealthSchema = t.Union([t.Literal('healthy'), t.Literal('degraded'), t.Literal('critical')])

export const ClusterStatusSchema = t.Object({
  clusterId: t.String(),
  isClusterMode: t.Boolean(),
  localPodId: t.String(),
  podCount: t.Number(),
  healthyPodCount: t.Number(),
  leaderId: t.Nullable(t.String()),
  leaderAddress: t.Nullable(t.String()),
  term: t.Number(),
  isLeader: t.Boolean({ description: 'this pod leads now (its lease is renewed within the deadline)' }),
  coordination: t.String({ description: 'etcd, kubernetes or static' }),
  expectedSize: t.Number(),
  totalModelsLoaded: t.Number(),
  totalGpus: t.Number(),
  routingTableVersion: t.Number(),
  health: HealthSchema,
})

export const PodSchema = t.Object({
  podId: t.String(),
  address: t.String(),
  role: t.Union([t.Literal('leader'), t.Literal('follower')]),
  status: t.Union([t.Literal('healthy'), t.Literal('unhealthy')]),
  lastHeartbeat: t.Nullable(t.String()),
  joinedAt: t.Nullable(t.String()),
  modelCount: t.Number(),
  gpus: t.Array(PodGpuSchema),
  models: t.Array(PodModelSchema),
})

export const ClusterEventTypeSchema = t.Union([
  t.Literal('model-loaded'),
  t.Literal('model-unloaded'),
  t.Literal('model-moved'),
  t.Literal('leader-elected'),
  t.Literal('pod-joined'),
  t.Literal('pod-left'),
])

/**
 * ClusterEventBody: POST /internal/cluster/event. Every event
 * carries the sender's state, so a receiver never needs a second call to act on it; leader-elected
 * carries the term and the leader's first routing table.
 */
export const ClusterEventBody = t.Object({
  type: ClusterEventTypeSchema,
  podId: t.String({ minLength: 1, maxLength: 253 }),
  at: t.String(),
  instanceId: t.Optional(t.String({ maxLength: 256 })),
  modelName: t.Optional(t.String({ maxLength: 1024 })),
  term: t.Optional(t.Number()),
  state: t.Optional(PodStateSchema),
  routingTable: t.Optional(RoutingTableSchema),
})

/** HeartbeatBody: POST /internal/heartbeat; a leader's heartbeat also carries its routing table. */
export const HeartbeatBody = t.Object({
  state: PodStateSchema,
  routingTable: t.Optional(RoutingTableSchema),
})

export const HeartbeatReplySchema = t.Object({
  podId: t.String(),
  term: t.Number(),
  routingTableVersion: t.Number(),
})

export const InternalStateSchema = t.Object({
  state: PodStateSchema,
  leaderId: t.Nullable(t.String()),
  term: t.Number(),
  routingTable: RoutingTableSchema,
  pods: t.Array(PodSchema),
})

export type PodGpu = Static<typeof PodGpuSchema>
export type PodModel = Static<typeof PodModelSchema>
export type PodState = Static<typeof PodStateSchema>
export type RoutingEntry = Static<typeof RoutingEntrySchema>
export type RoutingTable = Static<typeof RoutingTableSchema>
export type ClusterStatus = Static<typeof ClusterStatusSchema>
export type Pod = Static<typeof PodSchema>
export type ClusterEvent = Static<typeof ClusterEventBody>
export type ClusterEventType = Static<typeof ClusterEventTypeSchema>
export type Heartbeat = Static<typeof HeartbeatBody>
export type InternalState = Static<typeof InternalStateSchema>
