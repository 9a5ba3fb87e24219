import { type Static, t } from 'elysia'
import { LoadBody, MoveRecordSchema } from '../../gateway/api.ts'

/**
 * The cluster move's records and bodies: the cluster move body (camelCase, as every cluster
 * request body), the move record the single-pod move answers plus the two pods, and the bodies of the internal
 * routes a move needs between pods.
 */

/** ClusterMoveBody: POST /api/cluster/models/:instanceId/move. */
export const ClusterMoveBody = t.Object(
  {
    targetPodId: t.Optional(
      t.String({
        minLength: 1,
        maxLength: 253,
        description: 'the pod to move to; omitted (or the owning pod) means a GPU move on the owning pod',
      }),
    ),
    targetGpuIds: t.Array(t.Integer({ minimum: 0 }), { minItems: 1, maxItems: 64 }),
    drainTimeoutMs: t.Optional(t.Integer({ minimum: 0, maximum: 3_600_000, default: 60000 })),
  },
  { additionalProperties: false },
)

/** ClusterMoveRecordSchema: the single-pod move record, plus the pod that runs it and the target pod. */
export const ClusterMoveRecordSchema = t.Composite([
  MoveRecordSchema,
  t.Object({
    podId: t.String({ description: 'the pod that holds the source and runs the move' }),
    targetPodId: t.String({ description: 'the pod the target loads on (podId for a GPU move on one pod)' }),
  }),
])

/** StartBody: POST /internal/moves, a move started on the pod that holds the instance. */
export const StartBody = t.Composite([
  t.Object({ instanceId: t.String({ minLength: 1, maxLength: 256 }) }),
  ClusterMoveBody,
])

export const MoveFitSchema = t.Object({
  instance_id: t.String({ maxLength: 256 }),
  footprint_gib: t.Nullable(t.Number({ minimum: 0 })),
  gpu_memory_utilization: t.Number({ exclusiveMinimum: 0, maximum: 1 }),
  sharedcache_enabled: t.Boolean(),
})

/** CheckBody: does this pod have room on these GPUs for the source the other pod holds? */
export const CheckBody = t.Object({
  fit: MoveFitSchema,
  gpuIds: t.Array(t.Integer({ minimum: 0 }), { minItems: 1, maxItems: 64 }),
})

/** TargetLoadBody: the gateway's load body, loaded out of routing with its move running. */
export const TargetLoadBody = LoadBody

export const TargetLoadedSchema = t.Object({ instanceId: t.String(), port: t.Number() })

export const InstanceBody = t.Object({ instanceId: t.String({ minLength: 1, maxLength: 256 }) })

export const ReleaseBody = t.Object({
  instanceId: t.String({ minLength: 1, maxLength: 256 }),
  drainTimeoutMs: t.Integer({ minimum: 0, maximum: 3_600_000 }),
})

/**
 * TableWant: what a pod's routing table must say before a move goes on: the instance on `podId`
 * listening on `port` (its engine port, the table's vllmPort) is listed for `model`, or not.
 */
export const TableWantSchema = t.Object({
  model: t.String({ maxLength: 1024 }),
  podId: t.String({ maxLength: 253 }),
  port: t.Integer({ minimum: 0, maximum: 65535 }),
  present: t.Boolean(),
})

export const TableWaitBody = t.Object({
  want: TableWantSchema,
  timeoutMs: t.Integer({ minimum: 1, maximum: 600_000 }),
})

export const TableVersionSchema = t.Object({ podId: t.String(), version: t.Number() })

/** HoldBody: the leader's move lock, asked for (or let go) by the pod that runs a move. */
export const HoldBody = t.Object({
  holdId: t.String({ minLength: 1, maxLength: 64 }),
  podId: t.String({ minLength: 1, maxLength: 253 }),
})

/** ActiveMovesSchema: what a pod runs: its cluster moves (their holds) and whether its gateway moves. */
export const ActiveMovesSchema = t.Object({
  podId: t.String(),
  holds: t.Array(t.String()),
  gatewayMove: t.Boolean(),
})

export const OkSchema = t.Object({ ok: t.Boolean() })

export type ClusterMoveRequest = Static<typeof ClusterMoveBody>
export type ClusterMoveRecord = Static<typeof ClusterMoveRecordSchema>
export type StartRequest = Static<typeof StartBody>
export type TableWant = Static<typeof TableWantSchema>
export type ActiveMoves = Static<typeof ActiveMovesSchema>
export type Hold = Static<typeof HoldBody>
