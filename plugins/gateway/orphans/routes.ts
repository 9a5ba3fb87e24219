import { Elysia } from 'elysia'
import { principalOf } from '../../../src/http/app.ts'
import { ControllerError } from '../../../src/http/schemas.ts'
import { OrphanKillQuery, OrphanKillResultSchema, OrphanListSchema, OrphanParams } from './schemas.ts'
import type { OrphanService } from './service.ts'

/**
 * orphanRoutes: list and kill orphan processes. Listing is a read (admin and admin-readonly);
 * killing needs admin. Thin: OrphanService decides.
 */
const tags = ['gateway']

export function orphanRoutes(orphans: OrphanService) {
  return new Elysia({ name: 'gateway-orphan-routes' })
    .get('/api/orphans', () => orphans.list(), {
      response: { 200: OrphanListSchema },
      detail: {
        tags,
        summary: 'List orphan engines',
        description:
          'Inference-engine processes on this host that this gateway does not manage: holding GPU memory ' +
          '(nvidia-smi compute apps) or looking like an engine (`vllm serve`, a `VLLM::…` process, ' +
          '`modelgate sim engine`). Each shows its pid, command line, GPU memory per GPU, start time and whether ' +
          'it carries a modelgate marker (MODELGATE_INSTANCE_ID, MODELGATE_DATA_DIR: another install’s, or ' +
          'this data dir’s from before a crash), with the install that owns it. An engine leading its process ' +
          'group is listed once with every process of its group (engine-looking or not), any other engine with ' +
          'its descendants: exactly what DELETE stops. Without a GPU probe the list still shows engines found ' +
          'by their command line.',
        'x-auth': 'admin',
      },
    })
    .delete(
      '/api/orphans/:pid',
      ({ params, query, request }) =>
        orphans.kill(Number(params.pid), query.start_time, principalOf(request)?.username ?? 'anonymous'),
      {
        params: OrphanParams,
        query: OrphanKillQuery,
        response: {
          200: OrphanKillResultSchema,
          400: ControllerError,
          404: ControllerError,
          409: ControllerError,
        },
        detail: {
          tags,
          summary: 'Stop an orphan engine',
          description:
            'Pass back the `start_time` the listing showed. The process is read again first: 404 ' +
            'ORPHAN_NOT_FOUND when it is gone or not an orphan engine; 409 ORPHAN_MANAGED when it belongs to ' +
            'an instance this gateway manages; 409 ORPHAN_CHANGED when the pid is now another process (its ' +
            'start time differs: nothing is signalled); 409 ORPHAN_NOT_PERMITTED for another user’s process; ' +
            '409 ORPHAN_FOREIGN when a process of it carries another modelgate install’s marker (the message ' +
            'names that install’s data dir: stop it through that modelgate). Signals exactly the processes ' +
            'the last listing showed under it, each only if its pid still has the listed start time (SIGTERM, ' +
            'the engine stop grace, SIGKILL): a process that joined its group since is never reached. ' +
            'Answers once they are gone (or after SIGKILL and 5 s).',
          'x-auth': 'admin',
        },
      },
    )
}
