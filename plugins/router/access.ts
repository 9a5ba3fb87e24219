import type { AuthService } from '../../src/http/auth.ts'
import type { AppError } from '../../src/http/errors.ts'
import type { Admission } from '../../src/wire/route.ts'
import type { ModelEntry } from './model-table.ts'

/**
 * GatewayKeyGate: the router must not be a way around the gateway's inference key. When the key
 * is set (`auth.inference_api_key`) and the router follows the gateway, a request that does not
 * name a standalone endpoint model (`plugins.router.models`) needs the key, checked by the
 * gateway's own AuthService (constant time, its 401 `missing_api_key` / `invalid_api_key`): the
 * inference routes and the actions that change a model's state. Standalone models keep the
 * no-auth default.
 *
 * Unknown names need the key too, so that the answer to a caller without it (401) does not depend
 * on which gateway models exist at that moment: only a key holder tells a gateway model (served)
 * from an unknown name (404). The decision rests on the configuration alone (a configured name
 * always wins over a gateway instance of the same name), so it cannot change under a held request.
 */
export class GatewayKeyGate {
  private readonly guarded: boolean

  constructor(
    private readonly auth: AuthService,
    followsGateway: boolean,
    /** Standalone endpoint models are configured (plugins.router.models): some names need no key. */
    private readonly standalone: boolean,
  ) {
    this.guarded = followsGateway && auth.inferenceKeyRequired
  }

  /**
   * admit decides from the head, before the body is read: a request with the key goes on; without
   * it, it is refused at once (401) unless standalone models exist, which need no key and can only
   * be told from the model in the body: then it is `anonymous`, and its body gets the small limit of
   * a request nobody vouched for. check() decides again once the model is known.
   */
  admit(authorization: string | null): Admission {
    if (!this.guarded) return null
    const denied = this.auth.checkInferenceKey(authorization)
    if (!denied) return null
    return this.standalone ? 'anonymous' : denied
  }

  /**
   * check returns the 401 for a request naming `entry` (undefined: a name the router does not
   * know) with this Authorization header value, or null when it may go on.
   */
  check(entry: ModelEntry | undefined, authorization: string | null): AppError | null {
    if (!this.guarded || (entry !== undefined && entry.endpoint !== null)) return null
    return this.auth.checkInferenceKey(authorization)
  }
}
