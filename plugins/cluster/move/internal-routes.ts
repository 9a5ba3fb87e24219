import { Elysia, t } from 'elysia'
import { notFound } from '../../../src/http/errors.ts'
import { ControllerError } from '../../../src/http/schemas.ts'
import { termAdmission } from '../internal-routes.ts'
import type { TermFence } from '../term.ts'
import {
  ActiveMovesSchema,
  CheckBody,
  ClusterMoveRecordSchema,
  HoldBody,
  InstanceBody,
  OkSchema,
  ReleaseBody,
  StartBody,
  TableVersionSchema,
  TableWaitBody,
  TargetLoadBody,
  TargetLoadedSchema,
} from './schemas.ts'
import type { ClusterMoves } from './service.ts'

/**
 * moveInternalRoutes: the Internal API of a move across pods. Each acts on this pod only (never a
 * second hop): the move's start on the pod that holds the instance, its record, events and cancel on
 * the pod that runs it, the leader's lock, the target pod's steps, and every pod's table wait.
 */
const tags = ['internal']
const Errors = {
  400: ControllerError,
  401: ControllerError,
  404: ControllerError,
  409: ControllerError,
  503: ControllerError,
  504: ControllerError,
}
const MoveId = t.Object({ moveId: t.String({ maxLength: 128 }) })
const ok = { ok: true }

export function moveInternalRoutes(moves: ClusterMoves, fence: TermFence) {
  const pod = moves.local
  return new Elysia({ name: 'cluster-move-internal-routes' })
    .use(termAdmission(fence))
    .post('/internal/moves', ({ body }) => moves.startHere(body), {
      body: StartBody,
      response: { 200: ClusterMoveRecordSchema, ...Errors },
      detail: { tags, summary: 'Start a move of an instance this pod holds (the cluster move body)' },
    })
    .get('/internal/moves/active', () => moves.active(), {
      response: { 200: ActiveMovesSchema, ...Errors },
      detail: { tags, summary: 'The moves this pod runs (for the leader’s move lock)' },
    })
    .post(
      '/internal/moves/lock',
      async ({ body }) => {
        await moves.lock.acquire(body)
        return ok
      },
      {
        body: HoldBody,
        response: { 200: OkSchema, ...Errors },
        detail: {
          tags,
          summary: 'The leader’s move lock: one move at a time in the cluster',
          description: '409 MOVE_IN_PROGRESS while another pod runs a move; 409 NOT_LEADER on a follower.',
        },
      },
    )
    .post(
      '/internal/moves/unlock',
      ({ body }) => {
        moves.lock.release(body.holdId)
        return ok
      },
      {
        body: HoldBody,
        response: { 200: OkSchema, ...Errors },
        detail: { tags, summary: 'Let a move’s hold go' },
      },
    )
    .get(
      '/internal/moves/:moveId',
      ({ params }) => {
        const record = moves.directory.localRecord(params.moveId)
        if (!record) throw notFound(`No move with id '${params.moveId}' here`, 'MOVE_NOT_FOUND')
        return record
      },
      {
        params: MoveId,
        response: { 200: ClusterMoveRecordSchema, ...Errors },
        detail: { tags, summary: 'A move this pod runs (404 otherwise)' },
      },
    )
    .get(
      '/internal/moves/:moveId/events',
      ({ params, request }) => moves.directory.localEvents(params.moveId, request.signal),
      { params: MoveId, detail: { tags, summary: 'SSE move progress of a move this pod runs' } },
    )
    .delete(
      '/internal/moves/:moveId',
      ({ params, query, set }) => {
        moves.cancelLocal(params.moveId, query.force === 'true')
        set.status = 204
        return undefined
      },
      {
        params: MoveId,
        query: t.Object({ force: t.Optional(t.Union([t.Literal('true'), t.Literal('false')])) }),
        response: { 204: t.Void(), ...Errors },
        detail: { tags, summary: 'Cancel a move this pod runs' },
      },
    )
    .post(
      '/internal/moves/:moveId/target/check',
      async ({ body }) => {
        await pod.check(body.fit, body.gpuIds)
        return ok
      },
      {
        params: MoveId,
        body: CheckBody,
        response: { 200: OkSchema, ...Errors },
        detail: { tags, summary: 'Target pod: room on these GPUs for the source?' },
      },
    )
    .post('/internal/moves/:moveId/target/load', ({ body }) => pod.loadTarget(body), {
      params: MoveId,
      body: TargetLoadBody,
      response: { 200: TargetLoadedSchema, ...Errors },
      detail: { tags, summary: 'Target pod: load the target out of routing, its move running' },
    })
    .post(
      '/internal/moves/:moveId/target/serve',
      async ({ body }) => {
        await pod.serve(body.instanceId)
        return ok
      },
      {
        params: MoveId,
        body: InstanceBody,
        response: { 200: OkSchema, ...Errors },
        detail: { tags, summary: 'Target pod: the target takes requests and enters the routing table' },
      },
    )
    .post(
      '/internal/moves/:moveId/target/withdraw',
      ({ body }) => {
        pod.withdraw(body.instanceId)
        return ok
      },
      {
        params: MoveId,
        body: InstanceBody,
        response: { 200: OkSchema, ...Errors },
        detail: { tags, summary: 'Target pod: the target leaves the routing table (a rollback)' },
      },
    )
    .post(
      '/internal/moves/:moveId/target/release',
      async ({ body }) => {
        await pod.release(body.instanceId, body.drainTimeoutMs, moves.timeouts.unloadMs)
        return ok
      },
      {
        params: MoveId,
        body: ReleaseBody,
        response: { 200: OkSchema, ...Errors },
        detail: {
          tags,
          summary: 'Target pod: drain (up to drainTimeoutMs) and unload the target (a rollback)',
        },
      },
    )
    .post(
      '/internal/moves/:moveId/target/commit',
      ({ body }) => {
        pod.commit(body.instanceId)
        return ok
      },
      {
        params: MoveId,
        body: InstanceBody,
        response: { 200: OkSchema, ...Errors },
        detail: { tags, summary: 'Target pod: the move is over; the target is an ordinary instance' },
      },
    )
    .post(
      '/internal/moves/:moveId/table',
      async ({ body }) => ({
        podId: moves.podId,
        version: await pod.awaitTable(body.want, body.timeoutMs),
      }),
      {
        params: MoveId,
        body: TableWaitBody,
        response: { 200: TableVersionSchema, ...Errors },
        detail: {
          tags,
          summary: 'Wait until this pod’s routing table lists (or no longer lists) an instance',
          description: 'Woken by each table this pod adopts; 504 TABLE_TIMEOUT past timeoutMs.',
        },
      },
    )
}
