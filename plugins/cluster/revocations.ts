import { Elysia, t } from 'elysia'
import type { EventBus } from '../../src/host/bus.ts'
import type { Logger } from '../../src/host/logger.ts'
import { MAX_JTI_LENGTH, type Revocation, type RevocationOrigin } from '../../src/http/revocations.ts'
import { ControllerError } from '../../src/http/schemas.ts'
import type { PeerCalls, PeerTarget } from './peer-client.ts'

/**
 * A logout on one pod holds on every pod. The token is the cluster's (every pod checks it with the
 * same JWT_SECRET), so a revocation kept by one pod alone would leave it working on the others:
 *
 * - told: a logout on this pod (`auth.revoked`, origin local) is sent at once to every other pod
 *   this pod knows, `POST /internal/auth/revocations`; each keeps it (in its own data dir) and
 *   refuses the token from then on;
 * - learnt: a pod that was down missed what was sent meanwhile, so when it starts it asks every
 *   other pod for the revocations in force (`GET /internal/auth/revocations`), before its start
 *   completes; and when another pod announces it (re)joined, this pod asks it in turn, so what
 *   was revoked on that pod alone reaches this one.
 *
 * Any pod may revoke, whatever term it has seen: a revocation is not a leader's command and only
 * ever refuses more, so these routes skip the term fence (refusing a stale term would leave a
 * logged-out token valid). They are signed and addressed like every internal call.
 */
export const REVOCATIONS_PATH = '/internal/auth/revocations'
/** The most revocations one POST carries (a logout sends one). */
const MAX_PER_POST = 1000

/** RevocationKeeper: what the sync uses of the host's revocations (AuthService.revocations). */
export interface RevocationKeeper {
  list(): Revocation[]
  add(revocations: readonly Revocation[], origin: RevocationOrigin): Revocation[]
}

export interface RevocationSyncDeps {
  keeper: RevocationKeeper
  peers: Pick<PeerCalls, 'request'>
  /** The other pods this pod knows (ClusterService.members.peers()). */
  others: () => PeerTarget[]
  bus: EventBus
  log: Logger
  /** Deadline of one call (plugins.cluster.request_timeout_ms). */
  timeoutMs: number
}

export class RevocationSync {
  private readonly offs: (() => void)[] = []
  private readonly pending = new Set<Promise<unknown>>()

  constructor(private readonly d: RevocationSyncDeps) {}

  /** start: tell the others about each logout here, and learn what they revoked (awaited). */
  async start(): Promise<void> {
    this.offs.push(
      this.d.bus.on('auth.revoked', (e) => {
        if (e.origin === 'local') this.tell(e.revocations)
      }),
      this.d.bus.on('cluster.pod.joined', (pod) => this.track(this.learnFrom(pod))),
    )
    await Promise.all(this.d.others().map((pod) => this.learnFrom(pod)))
  }

  async stop(deadline: AbortSignal): Promise<void> {
    for (const off of this.offs.splice(0)) off()
    await Promise.race([
      Promise.allSettled([...this.pending]),
      new Promise((r) => deadline.addEventListener('abort', r, { once: true })),
    ])
  }

  /** tell sends new revocations to every other pod (one that cannot be reached learns them when it rejoins). */
  private tell(revocations: Revocation[]): void {
    for (const pod of this.d.others())
      this.track(
        this.d.peers
          .request(pod, 'POST', REVOCATIONS_PATH, { revocations }, { timeoutMs: this.d.timeoutMs })
          .catch((err: unknown) =>
            this.d.log.warn('a pod was not told of a logout (it learns it when it rejoins)', {
              pod: pod.podId,
              error: err instanceof Error ? err.message : String(err),
            }),
          ),
      )
  }

  /** learnFrom asks `pod` for the revocations in force and keeps those this pod lacked. */
  private async learnFrom(pod: PeerTarget): Promise<void> {
    try {
      const answer = await this.d.peers.request<{ revocations: Revocation[] }>(
        pod,
        'GET',
        REVOCATIONS_PATH,
        undefined,
        { timeoutMs: this.d.timeoutMs },
      )
      const added = this.d.keeper.add(answer.revocations, 'peer')
      if (added.length > 0)
        this.d.log.info('logouts learnt from a pod', { pod: pod.podId, count: added.length })
    } catch (err) {
      this.d.log.debug('could not ask a pod for its logouts', {
        pod: pod.podId,
        error: err instanceof Error ? err.message : String(err),
      })
    }
  }

  private track(p: Promise<unknown>): void {
    this.pending.add(p)
    void p.finally(() => this.pending.delete(p))
  }
}

const RevocationSchema = t.Object({
  jti: t.String({ minLength: 1, maxLength: MAX_JTI_LENGTH }),
  exp: t.Integer({ minimum: 0, description: 'the token’s exp (Unix seconds): refused until then' }),
})
const errors = { 400: ControllerError, 401: ControllerError, 403: ControllerError }

/** revocationRoutes: the receiving side of RevocationSync (signed and addressed; no term fence, see above). */
export function revocationRoutes(keeper: RevocationKeeper) {
  const tags = ['internal']
  return new Elysia({ name: 'cluster-revocation-routes' })
    .get(REVOCATIONS_PATH, () => ({ revocations: keeper.list() }), {
      response: { 200: t.Object({ revocations: t.Array(RevocationSchema) }), ...errors },
      detail: { tags, summary: 'The logged-out tokens this pod refuses, for a pod that (re)joined' },
    })
    .post(REVOCATIONS_PATH, ({ body }) => ({ added: keeper.add(body.revocations, 'peer').length }), {
      body: t.Object({ revocations: t.Array(RevocationSchema, { maxItems: MAX_PER_POST }) }),
      response: { 200: t.Object({ added: t.Integer() }), ...errors },
      detail: {
        tags,
        summary: 'Tokens logged out on another pod: refused here too until they expire',
        description: '`added` counts those this pod did not refuse already.',
      },
    })
}
