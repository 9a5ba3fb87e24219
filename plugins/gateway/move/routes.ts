import { Elysia, t } from 'elysia'
import { notFound } from '../../../src/http/errors.ts'
import { ControllerError } from '../../../src/http/schemas.ts'
import { sseResponse } from '../../../src/http/sse.ts'
import { MoveRecordSchema } from '../schemas.ts'
import type { MoveManager } from './service.ts'

/** moveRoutes: start, follow and cancel blue-green moves (README "Behaviour in detail"). */
const tags = ['gateway']

export function moveRoutes(moves: MoveManager) {
  return new Elysia({ name: 'gateway-move-routes' })
    .post(
      '/api/models/instances/:instance_id/move',
      async ({ params, body, set }) => {
        const record = await moves.start({
          instanceId: params.instance_id,
          targetGpuIds: body.target_gpu_ids,
          drainTimeoutMs: body.drain_timeout_ms ?? 60000,
        })
        set.status = 202
        return record
      },
      {
        params: t.Object({ instance_id: t.String() }),
        body: t.Object(
          {
            target_gpu_ids: t.Array(t.Integer({ minimum: 0 }), { minItems: 1 }),
            drain_timeout_ms: t.Optional(t.Integer({ minimum: 0, maximum: 3_600_000, default: 60000 })),
          },
          { additionalProperties: false },
        ),
        response: {
          202: MoveRecordSchema,
          400: ControllerError,
          404: ControllerError,
          409: ControllerError,
          503: ControllerError,
        },
        detail: {
          tags,
          summary: 'Move a running or sleeping instance to other GPUs (blue-green)',
          description:
            'Phases: validating → spawning (progress 0–100 from the target’s load) → switching (new requests go to the ' +
            'target) → draining (wait for the source’s in-flight requests, up to drain_timeout_ms) → completing (unload ' +
            'the source) → completed; any failure rolls back to the source (phase failed, with error). The target gets the ' +
            'source’s model path, served name, max_tokens, sleep flag and extra_args. 400: same GPUs, wrong count for the ' +
            'tensor parallel size, unknown GPU, not enough free memory for the measured footprint, or no measurement at ' +
            'all; 404 unknown instance; 409 another move in progress.',
        },
      },
    )
    .get(
      '/api/models/moves/:move_id/events',
      ({ params, request }) => {
        if (!moves.get(params.move_id))
          throw notFound(`No move with id '${params.move_id}'`, 'MOVE_NOT_FOUND')
        return sseResponse(
          (sink) =>
            moves.subscribe(
              params.move_id,
              (e) => sink.send('move_progress', e),
              () => sink.close(),
            ) ?? undefined,
          { signal: request.signal },
        )
      },
      {
        params: t.Object({ move_id: t.String() }),
        query: t.Object({ token: t.Optional(t.String()) }),
        detail: {
          tags,
          summary: 'Move progress (SSE)',
          description:
            'Events named `move_progress` with data {move_id, phase, message, progress, error}; a late subscriber gets ' +
            'the current phase first; the stream ends after completed or failed.',
        },
      },
    )
    .delete(
      '/api/models/moves/:move_id',
      ({ params, query, set }) => {
        moves.cancel(params.move_id, query.force === 'true')
        set.status = 204
        return undefined
      },
      {
        params: t.Object({ move_id: t.String() }),
        query: t.Object({ force: t.Optional(t.Union([t.Literal('true'), t.Literal('false')])) }),
        response: { 204: t.Void(), 404: ControllerError, 409: ControllerError },
        detail: {
          tags,
          summary: 'Cancel a move',
          description:
            'validating: abort; spawning: kill the target, keep the source; switching/draining: force=false reverts ' +
            'routing to the source and unloads the target, force=true completes at once and unloads the source (may drop ' +
            'connections); completing: 409 too late; completed/failed: 409. A cancelled move ends in phase failed with ' +
            'error "cancelled" (or completed when forced).',
        },
      },
    )
}
