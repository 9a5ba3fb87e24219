import type { AuthService } from '../../src/http/auth.ts'
import { AppError } from '../../src/http/errors.ts'
import type { Admission, InferenceGrant } from '../../src/wire/route.ts'
import type { ModelEntry } from './model-table.ts'

/**
 * GatewayKeyGate: the router must not be a way around the gateway's inference keys. When inference
 * needs a key (`auth.inference_api_key`, or keys created through `/api/keys`) and the router follows
 * the gateway, a request that does not name a standalone endpoint model (`plugins.router.models`)
 * needs one, judged by the gateway's own AuthService (the same 401s, and a key's limits: 429s with
 * their headers, the model allowlist, usage): the inference routes and the actions that change a
 * model's state. Standalone models keep the no-auth default, and a key's limits do not apply to
 * them: a key refused from the head (unknown, or at its limits) is judged again once the body names
 * a gateway model. (A valid key's request per minute is taken at the head, before the model is
 * known, even when it turns out to be for a standalone model, which then counts no usage.)
 *
 * Unknown names need the key too, so that the answer to a caller without it (401) does not depend
 * on which gateway models exist at that moment: only a key holder tells a gateway model (served)
 * from an unknown name (404). The decision rests on the configuration alone (a configured name
 * always wins over a gateway instance of the same name), so it cannot change under a held request.
 */
/** ModelViewer: which models one caller of the model list sees, and whether with their engine addresses. */
export interface ModelViewer {
  readonly addresses: boolean
  sees(entry: ModelEntry): boolean
}

export class GatewayKeyGate {
  constructor(
    private readonly auth: AuthService,
    private readonly followsGateway: boolean,
    /** Standalone endpoint models are configured (plugins.router.models): some names need no key. */
    private readonly standalone: boolean,
  ) {}

  /** guarded: inference needs a key now (a key created at run time turns it on). */
  private get guarded(): boolean {
    return this.followsGateway && this.auth.inferenceKeyRequired
  }

  /**
   * admit decides from the head, before the body is read: a request with a key goes on with its
   * grant; without one (or with a key refused), it is refused at once unless standalone models
   * exist, which need no key and can only be told from the model in the body: then it is
   * `anonymous`, and its body gets the small limit of a request nobody vouched for. check()
   * decides again once the model is known.
   */
  admit(authorization: string | null): Admission {
    if (!this.guarded) return null
    // With standalone models a refusal here is provisional (check judges again): counted only then.
    const verdict = this.auth.admitInference(authorization, !this.standalone)
    if (!(verdict instanceof AppError)) return verdict
    return this.standalone ? 'anonymous' : verdict
  }

  /**
   * check judges a request naming `entry` (undefined: a name the router does not know) once its body
   * is read: the refusal, or the grant it goes with (admit's, or judged now for a request admit left
   * anonymous), or null (no key needed: a standalone model, or inference is open).
   */
  /**
   * viewer: what a caller of `GET /models` sees, judged from its Authorization as the inference routes
   * judge it: every model while inference is open or for an admin token; else the standalone models
   * (which need no key) and the gateway models its key lists. Without a key (or with one refused)
   * it sees the standalone models alone, or gets the refusal when there are none, as its inference
   * would. Engine addresses are for admins (or while admin access is open) only.
   */
  async viewer(authorization: string | null): Promise<AppError | ModelViewer> {
    const admin = await this.auth.isAdmin(authorization)
    if (admin || !this.guarded) return { addresses: admin, sees: () => true }
    const verdict = this.auth.admitInference(authorization)
    if (verdict instanceof AppError) {
      if (!this.standalone) return verdict
      return { addresses: false, sees: (e) => e.endpoint !== null }
    }
    return { addresses: false, sees: (e) => e.endpoint !== null || verdict === null || verdict.lists(e.name) }
  }

  check(
    entry: ModelEntry | undefined,
    grant: InferenceGrant | null,
    authorization: string | null,
  ): AppError | InferenceGrant | null {
    if (!this.guarded || (entry !== undefined && entry.endpoint !== null)) return null
    return grant ?? this.auth.admitInference(authorization)
  }
}
