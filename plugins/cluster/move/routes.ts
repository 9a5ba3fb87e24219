import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import { ClusterMoveBody, ClusterMoveRecordSchema } from './schemas.ts'
import type { ClusterMoves } from './service.ts'

/**
 * clusterMoveRoutes: the cluster API's move (admin JWT): start on whichever pod holds the instance,
 * follow and cancel from any pod. The cancel route applies the
 * single-pod move's cancel table to a cluster move, wherever it runs.
 */
const tags = ['cluster']
const Errors = {
  400: ControllerError,
  401: ControllerError,
  403: ControllerError,
  404: ControllerError,
  409: ControllerError,
  502: ControllerError,
  503: ControllerError,
  504: ControllerError,
}
const MoveId = t.Object({ moveId: t.String({ maxLength: 128 }) })
const PEERS =
  ' A pod that cannot be reached is 502 PEER_UNREACHABLE, one past plugins.cluster.request_timeout_ms 504 ' +
  'PEER_TIMEOUT; the owning pod’s refusals come back with their status and code.'

export function clusterMoveRoutes(moves: ClusterMoves) {
  return new Elysia({ name: 'cluster-move-routes' })
    .post(
      '/api/cluster/models/:instanceId/move',
      ({ params, body }) => moves.start(params.instanceId, body),
      {
        params: t.Object({ instanceId: t.String({ maxLength: 256 }) }),
        body: ClusterMoveBody,
        response: { 200: ClusterMoveRecordSchema, ...Errors },
        detail: {
          tags,
          summary: 'Move an instance to other GPUs, on its pod or another (blue-green)',
          description:
            'Runs on the pod that holds the instance (any pod forwards it there). Without targetPodId, or with the ' +
            'owning pod, it is that pod’s single-pod move. With another pod: validating (the leader’s move lock, ' +
            'then the target pod’s GPUs checked for the source’s measured footprint) → spawning (the target pod ' +
            'loads the source’s settings out of routing; progress 0–100) → switching (the target takes requests and ' +
            'enters every pod’s routing table; then the source leaves every table, then stops taking requests) → ' +
            'draining (the source’s in-flight requests, from any pod’s /v1, up to drainTimeoutMs) → completing ' +
            '(unload the source) → completed. Any failure rolls back: the source takes requests and rejoins every ' +
            'table before the target leaves them, drains and unloads (phase failed, with error). 200: the move ' +
            'record (move_id, phase validating, the instances and GPUs) with podId (the pod that runs it) and ' +
            'targetPodId. 400 wrong GPU count, repeated GPU, unknown GPU, not enough free memory on the target, no ' +
            'measurement; 404 MODEL_NOT_FOUND or POD_NOT_FOUND; 409 MOVE_IN_PROGRESS (one move at a time in the ' +
            'cluster, held by the leader) or the instance busy; 503 NO_LEADER, POD_UNHEALTHY.' +
            PEERS,
        },
      },
    )
    .get('/api/cluster/moves/:moveId', ({ params }) => moves.directory.record(params.moveId), {
      params: MoveId,
      response: { 200: ClusterMoveRecordSchema, ...Errors },
      detail: { tags, summary: 'A move’s record, from the pod that runs it (404 MOVE_NOT_FOUND)' },
    })
    .get(
      '/api/cluster/moves/:moveId/events',
      ({ params, request }) => moves.directory.events(params.moveId, request.signal),
      {
        params: MoveId,
        query: t.Object({ token: t.Optional(t.String()) }),
        detail: {
          tags,
          summary: 'Move progress (SSE), from any pod',
          description:
            'Events named `move_progress` with data {move_id, phase, message, progress, error}, relayed from the ' +
            'pod that runs the move; a late subscriber gets the current phase first; the stream ends after ' +
            'completed or failed. 404 MOVE_NOT_FOUND when no pod runs it (a pod keeps its last 50 finished moves).',
        },
      },
    )
    .delete(
      '/api/cluster/moves/:moveId',
      async ({ params, query, set }) => {
        await moves.directory.cancel(params.moveId, query.force === 'true', () =>
          moves.cancelLocal(params.moveId, query.force === 'true'),
        )
        set.status = 204
        return undefined
      },
      {
        params: MoveId,
        query: t.Object({ force: t.Optional(t.Union([t.Literal('true'), t.Literal('false')])) }),
        response: { 204: t.Void(), ...Errors },
        detail: {
          tags,
          summary: 'Cancel a move, from any pod (the single-pod cancel table)',
          description:
            'validating: abort; spawning: kill the target, keep the source; switching/draining: force=false puts ' +
            'the source back in every table and unloads the target (after draining it), force=true finishes the ' +
            'switch and unloads the source at once (may drop its connections); completing: 409 too late; ' +
            'completed/failed: 409 MOVE_NOT_CANCELLABLE; 404 MOVE_NOT_FOUND.',
        },
      },
    )
}
