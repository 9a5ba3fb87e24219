import { Elysia, t } from 'elysia'
import { ControllerError } from '../../src/http/schemas.ts'
import { ClusterEventBody, HeartbeatBody, HeartbeatReplySchema, InternalStateSchema } from './schemas.ts'
import type { ClusterService } from './service.ts'
import { TERM_HEADER, type TermFence } from './term.ts'

/**
 * internalRoutes: the pod-to-pod half of the internal API that membership needs. The listener's
 * front has verified the HMAC signature, timestamp, replay and rate before any of these runs
 * (plugins/cluster/signing.ts); here every request's term is admitted first (409 STALE_TERM below the
 * highest term this pod has seen).
 */
const tags = ['internal']
const errors = { 400: ControllerError, 401: ControllerError, 403: ControllerError, 409: ControllerError }

/**
 * termAdmission: the one check every internal route group starts with (use it first in each): the
 * request's X-Cluster-Term, refused 409 STALE_TERM below the highest term this pod has seen.
 */
export function termAdmission(fence: TermFence) {
  return new Elysia().onBeforeHandle({ as: 'scoped' }, ({ request }) => {
    fence.admit(request.headers.get(TERM_HEADER))
  })
}

export function internalRoutes(cluster: ClusterService) {
  return new Elysia({ name: 'cluster-internal-routes' })
    .use(termAdmission(cluster.fence))
    .get('/internal/ping', () => ({ podId: cluster.podId, term: cluster.fence.term }), {
      response: { 200: t.Object({ podId: t.String(), term: t.Number() }), ...errors },
      detail: { tags, summary: 'Liveness of a pod, with the highest term it has seen' },
    })
    .post('/internal/heartbeat', ({ body }) => cluster.onHeartbeat(body), {
      body: HeartbeatBody,
      response: { 200: HeartbeatReplySchema, ...errors },
      detail: {
        tags,
        summary:
          "A peer's heartbeat (every heartbeat_interval_ms): its state, and from the leader the routing table",
      },
    })
    .get('/internal/state', () => cluster.internalState(), {
      response: { 200: InternalStateSchema, ...errors },
      detail: { tags, summary: "This pod's full state, for a peer resynchronising after it (re)joined" },
    })
    .post(
      '/internal/cluster/event',
      ({ body }) => {
        cluster.onEvent(body)
        return { ok: true }
      },
      {
        body: ClusterEventBody,
        response: { 200: t.Object({ ok: t.Boolean() }), ...errors },
        detail: {
          tags,
          summary:
            'An immediate cluster event (model-loaded, model-unloaded, model-moved, leader-elected, pod-joined, pod-left)',
          description:
            "Each carries the sender's state (so no second call is needed); leader-elected carries the term and the " +
            "leader's routing table.",
        },
      },
    )
}
