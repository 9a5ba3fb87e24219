import { randomBytes, randomUUID } from 'node:crypto'
import { jwt } from '@elysiajs/jwt'
import type { RootConfig } from '../config/schema.ts'
import type { EventBus } from '../host/bus.ts'
import type { Logger } from '../host/logger.ts'
import type { Store } from '../store/db.ts'
import { INTERNAL_HEADER } from '../wire/headers.ts'
import type { InferenceGrant } from '../wire/route.ts'
import { bearerOf, safeEqual } from './credentials.ts'
import { AppError, forbidden, unauthorized } from './errors.ts'
import { InferenceKeys } from './keys/service.ts'
import { OAuthFlow, type OAuthUser, oauthProblems, oauthSettings } from './oauth.ts'
import { RevocationBook } from './revocations.ts'

/**
 * AuthService is the one guard for every route. It authorises the route the framework matched (its
 * registered pattern, e.g. `/api/v1/models/:id`), never a second reading of the URL: what a route
 * requires is read from the mounted routes themselves (declareRoutes), so the path that is
 * authorised is the path that is routed. A route's category (public, admin, inference, internal)
 * follows its pattern's prefix (categorize) unless its `detail` declares `x-auth`; a
 * state-free POST declares `x-read-only: true`, and a read that only `admin` may make declares
 * `x-required-role: 'admin'`. Routes never check auth themselves. Internal routes (`/internal/*`)
 * are judged on the one parse too: the listener's front checks the cluster signature on the raw
 * body (vetInternal, with the verifier the cluster plugin installs) and marks what it relays with a
 * per-process token; the guard accepts an internal route only with that token. Roles ride on
 * every admin request (`admin` for writes, `admin-readonly` may read): simple mode gives `admin`,
 * OAuth mode maps the platform's groups to roles (src/http/oauth.ts).
 */
export type Role = 'admin' | 'admin-readonly'
export type RouteCategory = 'public' | 'admin' | 'inference' | 'internal'
/** The auth section, and the login throttle from the server section. */
export type AuthConfig = RootConfig['auth'] & { logins_per_minute: number }

export interface Principal {
  sub: string
  username: string
  roles: Role[]
  authMode: string
  exp?: number
  jti?: string
}

/** TOKEN_ISSUER: the `iss` of every token modelgate issues, and the only one it accepts. */
export const TOKEN_ISSUER = 'modelgate'
/** TOKEN_AUDIENCE: the `aud` of every token modelgate issues (its admin API), and the only one it accepts. */
export const TOKEN_AUDIENCE = 'modelgate-admin'
/** How far in the future a token's `iat` may be (clocks of the pods that issue and check it differ). */
export const CLOCK_SKEW_SECONDS = 60

const ANONYMOUS_ADMIN: Principal = {
  sub: 'anonymous',
  username: 'anonymous',
  roles: ['admin'],
  authMode: 'none',
}

const INFERENCE_EXACT = new Set([
  '/tokenize',
  '/detokenize',
  '/pooling',
  '/classification',
  '/score',
  '/re-rank',
])

/**
 * categorize maps a route pattern to its auth category by its prefix (`/v1/`, `/api/direct/` and
 * the exact inference paths: inference; `/api/auth/`, `/api/health/`: public; `/internal/`:
 * internal; other `/api/`: admin). The guard applies it to patterns the routes registered, never to a URL.
 */
export function categorize(pathname: string): RouteCategory {
  if (pathname.startsWith('/v1/') || pathname === '/v1' || pathname.startsWith('/api/direct/'))
    return 'inference'
  if (INFERENCE_EXACT.has(pathname)) return 'inference'
  if (pathname.startsWith('/internal/')) return 'internal'
  if (pathname.startsWith('/api/')) {
    if (pathname === '/api/health' || pathname.startsWith('/api/health/')) return 'public'
    if (pathname === '/api/auth' || pathname.startsWith('/api/auth/')) return 'public'
    return 'admin'
  }
  // /docs, /docs/*, /metrics, and anything else (which is a 404 anyway).
  return 'public'
}

/**
 * InternalRequest: a request to `/internal/*` as the listener's front parsed it, for the cluster's
 * signature check: `target` is the path and query exactly as parsed (what is routed), `body` the
 * raw bytes as received, `peer` the client's address.
 */
export interface InternalRequest {
  method: string
  target: string
  headers: { get(name: string): string | null }
  body: Uint8Array
  peer: string
}

/** InternalHead: what the internal check can judge before the body arrives (the front's head stage). */
export type InternalHead = Omit<InternalRequest, 'body'>

/** InternalVerdict: a signed request accepted (with the sender's pod and term headers), or the refusal. */
export type InternalVerdict =
  | { ok: true; pod: string | null; term: number | null }
  | { ok: false; error: AppError }

/**
 * InternalCheck: what the cluster plugin installs (plugins/cluster/signing.ts InternalVerifier), in
 * two stages the front runs in order: `head` when a request's head is complete, before its body is
 * read (what cannot be a peer's request is refused there, unread); `verify` once its raw body is in.
 * They are one object because they share one rate budget per source address.
 */
export interface InternalCheck {
  head(req: InternalHead): AppError | null
  verify(req: InternalRequest): InternalVerdict
}

/** What a route requires, as declared by the route (see AuthService). */
export interface RouteAccess {
  category: RouteCategory
  /**
   * admin-readonly may call it: a GET (or HEAD), or a route declaring `x-read-only: true` (a POST
   * that changes nothing), unless it declares `x-required-role: 'admin'`.
   */
  readOnly: boolean
}

/** A mounted route as the framework lists it (Elysia's `app.routes`). */
export interface RouteDeclaration {
  method: string
  path: string
  hooks?: { detail?: unknown }
}

const CATEGORIES: ReadonlySet<string> = new Set(['public', 'admin', 'inference', 'internal'])

/**
 * accessOf reads a route's declaration: `detail['x-auth']` (its category), `detail['x-read-only']`
 * (a POST that changes nothing) and `detail['x-required-role']` (`'admin'` keeps a read for admins
 * only; `'admin-readonly'` is the same as `x-read-only: true`), else the defaults. A contradictory
 * declaration throws when the routes are declared (at boot), not at the first request.
 */
export function accessOf(r: RouteDeclaration): RouteAccess {
  const detail = (r.hooks?.detail ?? {}) as Record<string, unknown>
  const where = `route ${r.method} ${r.path}`
  const declared = detail['x-auth']
  if (declared !== undefined && (typeof declared !== 'string' || !CATEGORIES.has(declared)))
    throw new Error(`${where}: x-auth must be one of ${[...CATEGORIES].join(', ')}`)
  const readOnlyFlag = detail['x-read-only']
  if (readOnlyFlag !== undefined && typeof readOnlyFlag !== 'boolean')
    throw new Error(`${where}: x-read-only must be a boolean`)
  const role = detail['x-required-role']
  if (role !== undefined && role !== 'admin' && role !== 'admin-readonly')
    throw new Error(`${where}: x-required-role must be 'admin' or 'admin-readonly'`)
  if (role === 'admin' && readOnlyFlag === true)
    throw new Error(`${where}: x-read-only and x-required-role 'admin' contradict each other`)
  const method = r.method.toUpperCase()
  const category = (declared as RouteCategory | undefined) ?? categorize(r.path)
  if (role !== undefined && category !== 'admin')
    throw new Error(`${where}: x-required-role applies to admin routes only (this one is ${category})`)
  const read = method === 'GET' || method === 'HEAD' || readOnlyFlag === true || role === 'admin-readonly'
  return { category, readOnly: read && role !== 'admin' }
}

/** requiredRole: reads may be done by admin-readonly, everything that changes state needs admin. */
export function requiredRole(access: RouteAccess): Role {
  return access.readOnly ? 'admin-readonly' : 'admin'
}

export { safeEqual }

function bearer(req: Request): string | null {
  return bearerOf(req.headers.get('authorization'))
}

export interface LoginResult {
  token: string
  token_type: 'Bearer'
  expires_at: string
  expires_in: number
  user: { username: string; roles: Role[] }
}

/** The issued-token options: the subject when it is not the username, a shorter lifetime. */
export interface IssueOptions {
  sub?: string
  /** At most `jwt_ttl_seconds`; shorter when the identity provider vouches for less. */
  ttlSeconds?: number
}

export class AuthService {
  readonly mode: AuthConfig['mode']
  /** The OAuth client (OAuth mode with a complete `auth.oauth`), else null. */
  readonly oauth: OAuthFlow | null = null
  /** What is missing from `auth.oauth` in OAuth mode (the login routes answer 503 naming it). */
  readonly oauthProblems: readonly string[] = []
  /** Where auth events go (OAuth failures, once each); set by the host with useLog. */
  private log: Logger | null = null
  private readonly signer: {
    sign(p: Record<string, unknown>): Promise<string>
    verify(t: string, o: unknown): Promise<unknown>
  } | null
  /**
   * revocations: logged-out tokens (by jti) until they expire, kept in the data dir's SQLite once
   * the host attaches its store (useStore); the cluster plugin shares them with the other pods.
   */
  readonly revocations: RevocationBook
  /**
   * keys: the inference keys (src/http/keys/): the static INFERENCE_API_KEY as an unlimited one, and
   * the keys created through the admin API with their limits, budgets and usage.
   */
  readonly keys: InferenceKeys
  /** Password logins per client address in the current minute (login throttling). */
  private readonly logins = new Map<string, { since: number; count: number }>()
  /** What each mounted route requires, by `METHOD pattern` (declareRoutes). */
  private readonly routes = new Map<string, RouteAccess>()
  /** The cluster's signature check (useInternalVerifier); without one every internal route is refused. */
  private internal: InternalCheck | null = null
  /**
   * internalToken: this process's proof, in INTERNAL_HEADER, that its own front verified a relayed
   * internal request. Random per process; the front never forwards a client's copy of the header.
   */
  private readonly internalToken = randomBytes(32).toString('hex')

  constructor(
    private readonly cfg: AuthConfig,
    log?: Logger,
  ) {
    this.mode = cfg.mode
    this.log = log ?? null
    this.revocations = new RevocationBook(cfg.jwt_ttl_seconds + CLOCK_SKEW_SECONDS)
    this.keys = new InferenceKeys(cfg.inference_api_key || null)
    this.signer = cfg.jwt_secret
      ? (jwt({ name: 'jwt', secret: cfg.jwt_secret, alg: 'HS256' }).decorator
          .jwt as unknown as AuthService['signer'])
      : null
    if (cfg.mode === 'oauth') {
      this.oauthProblems = oauthProblems(cfg.oauth)
      const settings = oauthSettings(cfg.oauth)
      if (settings && cfg.jwt_secret)
        this.oauth = new OAuthFlow(settings, { secret: cfg.jwt_secret }, (msg, fields) =>
          this.log?.warn(msg, fields),
        )
    }
  }

  /**
   * useStore keeps revocations and inference keys (with their usage) in the host's store and
   * announces changes on its bus (at boot).
   */
  useStore(store: Store, bus: EventBus): void {
    this.revocations.attach(store, bus)
    this.keys.attach(store, bus, (err) =>
      this.log?.error('usage of inference keys not written (kept for the next try)', { error: String(err) }),
    )
  }

  /** useLog sets where auth events are logged (the host's logger, scoped `auth`). */
  useLog(log: Logger): void {
    this.log = log
    if (this.mode === 'oauth' && !this.oauth)
      log.error('AUTH_MODE=oauth is not configured: OAuth logins will fail', {
        problems: this.oauthProblems.join('; ') || 'auth.jwt_secret: required',
      })
  }

  /** logger: the auth log, or null before the host has set one. */
  get logger(): Logger | null {
    return this.log
  }

  /**
   * ownInferenceKey: the key this process's own clients (the dashboard of a signed-in admin, proxy
   * benchmarks) send to its inference routes: INFERENCE_API_KEY, else while keys are in force the
   * in-memory console key (InferenceKeys.ownKey); null while inference is open.
   */
  ownInferenceKey(): string | null {
    return this.keys.ownKey()
  }

  /** inferenceKeyRequired: inference needs a key (INFERENCE_API_KEY is set, or a key was ever created). */
  get inferenceKeyRequired(): boolean {
    return this.keys.required
  }

  /**
   * info tells a frontend how to log in. OAuth mode adds where the browser is sent
   * (`login_url`, a GET navigation), where it comes back (`frontend_url`, with
   * `#<token_fragment_parameter>=<JWT>&expires_in=<s>` in the fragment) and which groups grant which role.
   */
  info() {
    const o = this.oauth?.settings
    return {
      mode: this.mode,
      auth_enabled: this.mode !== 'none',
      login_url:
        this.mode === 'oauth' ? '/api/auth/login' : this.mode === 'simple' ? '/api/auth/login' : null,
      login_method: this.mode === 'oauth' ? 'GET' : this.mode === 'simple' ? 'POST' : null,
      inference_api_key_required: this.inferenceKeyRequired,
      token_lifetime_seconds: this.mode === 'none' ? null : this.cfg.jwt_ttl_seconds,
      roles: ['admin', 'admin-readonly'],
      oauth: o
        ? {
            issuer_url: o.issuerUrl,
            callback_url: o.callbackUrl,
            frontend_url: o.frontendUrl,
            token_fragment_parameter: 'token',
            groups: { admin: o.adminGroups, 'admin-readonly': o.readonlyGroups },
          }
        : null,
    }
  }

  async issueToken(username: string, roles: Role[], opts: IssueOptions = {}): Promise<LoginResult> {
    if (!this.signer) throw new AppError(400, 'AUTH_DISABLED', 'Authentication is disabled (AUTH_MODE=none)')
    const now = Math.floor(Date.now() / 1000)
    const ttl = Math.max(1, Math.min(this.cfg.jwt_ttl_seconds, opts.ttlSeconds ?? Number.POSITIVE_INFINITY))
    const exp = now + ttl
    const token = await this.signer.sign({
      iss: TOKEN_ISSUER,
      aud: TOKEN_AUDIENCE,
      sub: opts.sub ?? username,
      username,
      roles,
      authMode: this.mode,
      jti: randomUUID(),
      iat: now,
      exp,
    })
    return {
      token,
      token_type: 'Bearer',
      expires_at: new Date(exp * 1000).toISOString(),
      expires_in: ttl,
      user: { username, roles },
    }
  }

  /**
   * issueOAuthToken: modelgate's JWT for a user the platform vouched for (claims iss, aud, sub,
   * username, roles, authMode "oauth", iat, exp, jti). It never outlives the provider's access token.
   */
  issueOAuthToken(user: OAuthUser): Promise<LoginResult> {
    return this.issueToken(user.username, user.roles, {
      sub: user.sub,
      ...(user.providerExpiresIn ? { ttlSeconds: user.providerExpiresIn } : {}),
    })
  }

  /**
   * login checks simple-mode credentials in constant time and returns a JWT. `peer` is the client's
   * address: each may try `logins_per_minute` times a minute (a fixed window), then gets 429 with
   * Retry-After, so guessing a password costs the guesser time, not the host CPU.
   */
  async login(username: string, password: string, peer = 'unknown', now = Date.now()): Promise<LoginResult> {
    if (this.mode !== 'simple')
      throw new AppError(
        400,
        'LOGIN_NOT_AVAILABLE',
        `Password login is not available when AUTH_MODE=${this.mode}`,
      )
    const wait = this.takeLogin(peer, now)
    if (wait > 0)
      throw new AppError(
        429,
        'TOO_MANY_REQUESTS',
        `Too many login attempts from this address; retry in ${wait} s`,
        'rate_limit_error',
        undefined,
        { 'retry-after': String(wait) },
      )
    const userOk = safeEqual(username, this.cfg.admin_username)
    const passOk = safeEqual(password, this.cfg.admin_password ?? '')
    if (!(userOk && passOk)) throw unauthorized('Invalid username or password')
    return this.issueToken(username, ['admin'])
  }

  /**
   * verifyToken accepts only what issueToken makes (RFC 8725): HS256 with a valid signature, not
   * expired, issued by modelgate for its admin API (`iss`, `aud`), with `iat` no later than
   * CLOCK_SKEW_SECONDS from now and a lifetime (exp − iat) no longer than `jwt_ttl_seconds`, a `jti`
   * (what a logout revokes) that is not revoked, and known roles. A token signed with the secret but
   * made otherwise (a 10¹³ exp, an iat in the future, another issuer) is refused.
   */
  async verifyToken(token: string): Promise<Principal> {
    if (!this.signer) throw unauthorized()
    const header = decodeHeader(token)
    if (header?.alg !== 'HS256') throw unauthorized('Invalid token: algorithm must be HS256')
    const payload = (await this.signer.verify(token, { algorithms: ['HS256'], requiredClaims: ['exp'] })) as
      | Record<string, unknown>
      | false
    if (!payload) throw unauthorized('Invalid or expired token')
    const { sub, username, roles, authMode, exp, iat, jti, iss, aud } = payload
    if (
      typeof sub !== 'string' ||
      typeof exp !== 'number' ||
      typeof iat !== 'number' ||
      typeof jti !== 'string' ||
      jti === '' ||
      !Array.isArray(roles)
    )
      throw unauthorized('Invalid token: missing claims')
    if (iss !== TOKEN_ISSUER) throw unauthorized(`Invalid token: the issuer must be "${TOKEN_ISSUER}"`)
    if (aud !== TOKEN_AUDIENCE) throw unauthorized(`Invalid token: the audience must be "${TOKEN_AUDIENCE}"`)
    if (iat > Date.now() / 1000 + CLOCK_SKEW_SECONDS)
      throw unauthorized('Invalid token: issued in the future')
    if (exp - iat > this.cfg.jwt_ttl_seconds)
      throw unauthorized(
        'Invalid token: its lifetime is longer than this server issues (auth.jwt_ttl_seconds)',
      )
    if (this.revocations.has(jti)) throw unauthorized('Token has been revoked')
    const known = roles.filter((r): r is Role => r === 'admin' || r === 'admin-readonly')
    return {
      sub,
      username: typeof username === 'string' ? username : sub,
      roles: known,
      authMode: typeof authMode === 'string' ? authMode : this.mode,
      exp,
      jti,
    }
  }

  /** takeLogin counts one login attempt by `peer`; returns 0, or the seconds to wait when over the limit. */
  private takeLogin(peer: string, now: number): number {
    const WINDOW = 60_000
    let w = this.logins.get(peer)
    if (!w || now - w.since >= WINDOW) {
      // Forget finished windows before the table grows (many addresses, one attempt each).
      if (this.logins.size >= 10_000)
        for (const [k, v] of this.logins) if (now - v.since >= WINDOW) this.logins.delete(k)
      w = { since: now, count: 0 }
      this.logins.set(peer, w)
    }
    if (++w.count <= this.cfg.logins_per_minute) return 0
    return Math.max(1, Math.ceil((w.since + WINDOW - now) / 1000))
  }

  /** revoke refuses the principal's token from now until it expires (a logout on this pod). */
  revoke(principal: Principal): void {
    if (!principal.jti || !principal.exp) return
    this.revocations.add([{ jti: principal.jti, exp: principal.exp }], 'local')
  }

  /** declareRoutes records what each mounted route requires (call once the routes are mounted). */
  declareRoutes(routes: readonly RouteDeclaration[]): void {
    for (const r of routes) this.routes.set(`${r.method.toUpperCase()} ${r.path}`, accessOf(r))
  }

  /**
   * access: what the route `pattern` requires for `method` (HEAD is served by the GET route). A route
   * that was not declared falls back to its pattern's prefix and counts as writing: never more open
   * than its declaration would be.
   */
  access(method: string, pattern: string): RouteAccess {
    const m = method === 'HEAD' ? 'GET' : method
    return (
      this.routes.get(`${m} ${pattern}`) ??
      this.routes.get(`ALL ${pattern}`) ?? { category: categorize(pattern), readOnly: false }
    )
  }

  /**
   * adminPrincipal authenticates a controller request: the bearer header, or `?token=` on an event
   * stream route (EventSource cannot send headers); `route` is the matched pattern.
   */
  async adminPrincipal(req: Request, route: string): Promise<Principal> {
    if (this.mode === 'none') return ANONYMOUS_ADMIN
    let token = bearer(req)
    if (!token && route.endsWith('/events')) token = new URL(req.url).searchParams.get('token')
    if (!token) throw unauthorized('Missing bearer token')
    return this.verifyToken(token)
  }

  /**
   * isAdmin: whether `authorization` carries an admin token of either role, or admin access is open
   * (auth.mode none); never throws. What a route that answers everyone shows only to an operator
   * (the router's model list gives engine addresses to admins alone) asks.
   */
  async isAdmin(authorization: string | null): Promise<boolean> {
    if (this.mode === 'none') return true
    const token = bearerOf(authorization)
    if (!token) return false
    try {
      return (await this.verifyToken(token)).roles.length > 0
    } catch {
      return false
    }
  }

  /**
   * checkInference enforces the inference key on a route the framework serves (proxy error shape):
   * the same judgement as the front's (admitInference). The admin JWT is not accepted.
   */
  checkInference(req: Request): AppError | null {
    const verdict = this.admitInference(req.headers.get('authorization'))
    return verdict instanceof AppError ? verdict : null
  }

  /**
   * admitInference judges a request's inference key from its Authorization value, before its body is
   * read (the fronts' head stage, src/http/keys/service.ts): a refusal, a grant with the key's
   * limits, or null when inference is open. `final` false: a refusal that may yet be overruled is
   * not counted (InferenceKeys.admit).
   */
  admitInference(authorization: string | null, final = true): AppError | InferenceGrant | null {
    return this.keys.admit(authorization, Date.now(), final)
  }

  /**
   * useInternalVerifier installs the cluster's check on `/internal/*` (the cluster plugin's setup):
   * its head stage (internalHead) and its signature check (vetInternal).
   */
  useInternalVerifier(check: InternalCheck): void {
    this.internal = check
  }

  /**
   * internalHead is the front's check of every `/internal/` request the moment its head is complete,
   * before any body byte is read: the installed check's head stage (the sender, its rate, the
   * timestamp, the destination). Without a verifier every internal request is refused here (403).
   */
  internalHead(req: InternalHead): AppError | null {
    if (!this.internal) return internalRefused()
    return this.internal.head(req)
  }

  /**
   * vetInternal is the front's check of every request whose parsed path starts with `/internal/`,
   * relayed or hot, before anything answers it: the installed verifier judges it on the raw body.
   * Accepted, it returns the header line that tells this process's guard so (INTERNAL_HEADER with
   * the token); without a verifier every internal request is refused (403).
   */
  vetInternal(req: InternalRequest): { error: AppError } | { extraHead: string } {
    if (!this.internal) return { error: internalRefused() }
    const verdict = this.internal.verify(req)
    if (!verdict.ok) return { error: verdict.error }
    return { extraHead: `${INTERNAL_HEADER}: ${this.internalToken}\r\n` }
  }

  /**
   * guard is the single check every routed request passes, given the pattern of the route the
   * framework matched. It returns the principal for admin routes, null for public and inference
   * routes, or throws an AppError rendered in the route's shape.
   */
  async guard(req: Request, route: string): Promise<Principal | null> {
    const access = this.access(req.method, route)
    switch (access.category) {
      case 'public':
        return null
      case 'inference': {
        const err = this.checkInference(req)
        if (err) throw err
        return null
      }
      case 'internal': {
        // The signature was checked by the front (vetInternal), which alone can add the token; a
        // request it did not vet (no verifier, or a path it did not read as /internal/) stops here.
        if (!this.internal) throw internalRefused()
        const token = req.headers.get(INTERNAL_HEADER)
        if (token === null || !safeEqual(token, this.internalToken))
          throw unauthorized('Internal routes accept only signed cluster requests')
        return null
      }
    }
    const principal = await this.adminPrincipal(req, route)
    const need = requiredRole(access)
    const ok =
      principal.roles.includes('admin') || (need === 'admin-readonly' && principal.roles.includes(need))
    if (!ok) throw forbidden(need)
    return principal
  }
}

/** internalRefused: an internal route while no cluster verifier is installed. */
function internalRefused(): AppError {
  return new AppError(403, 'FORBIDDEN', 'Internal routes accept only signed cluster requests')
}

function decodeHeader(token: string): Record<string, unknown> | null {
  const part = token.split('.')[0]
  if (!part) return null
  try {
    return JSON.parse(Buffer.from(part, 'base64url').toString('utf8')) as Record<string, unknown>
  } catch {
    return null
  }
}
