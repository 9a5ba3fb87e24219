import { createHmac, timingSafeEqual } from 'node:crypto'
import * as oauth from 'oauth4webapi'
import type { RootConfig } from '../config/schema.ts'
import type { Store } from '../store/db.ts'
import { AppError } from './errors.ts'
import { UsedStates } from './oauth-states.ts'
import { httpUrl } from './url.ts'

/**
 * OAuth mode (`auth.mode: oauth`): modelgate is an OAuth 2 client of the platform's identity
 * provider (OpenShift's OAuth server, or any server speaking the authorization-code grant), and
 * issues its own JWT from what the platform says about the user. The protocol work (discovery,
 * PKCE, the authorization response, the code exchange) is oauth4webapi's; this file decides what
 * is asked, what is kept, and how every failure ends.
 *
 * 1. `start` (GET /api/auth/login): discover the provider, make `state` and a PKCE verifier, seal
 *    both (and the frontend's login nonce, if it sent one) in a short-lived signed cookie bound to
 *    this browser, redirect to the provider.
 * 2. `checkState`, then `finish` (GET /api/auth/callback): the cookie must be there, unforged,
 *    unexpired, name the same `state` as the query, and not have been used before (single use,
 *    remembered in the store across restarts until the login would have expired:
 *    oauth-states.ts); then the provider's error (if any) is reported, the code exchanged (PKCE
 *    verifier, client secret), the user and groups fetched from the platform
 *    (`K8S_API_URL/apis/user.openshift.io/v1/users/~`) with the access token, groups mapped to
 *    roles; no role → access denied, no token. The callback hands the nonce back beside the token.
 *
 * Every outgoing call has a deadline (`request_timeout_ms`). Every failure is an AppError with a
 * code, a status that is never 500, and a `reason` for the log (the route logs it once).
 */

export type OAuthConfig = RootConfig['auth']['oauth']
export type OAuthRole = 'admin' | 'admin-readonly'

/** The platform's current-user endpoint, relative to K8S_API_URL. */
export const USER_PATH = '/apis/user.openshift.io/v1/users/~'
/** The cookie that carries `state` and the PKCE verifier between login and callback. */
export const STATE_COOKIE = 'modelgate_oauth'
/** How long a started login may take before its callback is refused. */
export const STATE_TTL_SECONDS = 600

/** OAuthSettings: the `auth.oauth` section with every default applied. */
export interface OAuthSettings {
  issuerUrl: string
  clientId: string
  clientSecret: string
  k8sApiUrl: string
  apiBaseUrl: string
  callbackUrl: string
  frontendUrl: string
  scope: string
  adminGroups: string[]
  readonlyGroups: string[]
  requestTimeoutMs: number
}

const trimSlash = (u: string) => u.replace(/\/+$/, '')

/**
 * oauthProblems lists what is missing or wrong in `auth.oauth` for OAuth mode, by dotted path (the
 * config loader reports them at start-up; the login route answers 503 naming them otherwise).
 */
export function oauthProblems(o: OAuthConfig | undefined): string[] {
  const problems: string[] = []
  const cfg = o ?? {}
  for (const [k, env] of [
    ['issuer_url', 'OAUTH_ISSUER_URL'],
    ['k8s_api_url', 'K8S_API_URL'],
    ['api_base_url', 'API_BASE_URL'],
  ] as const) {
    const v = cfg[k]
    if (!v) problems.push(`auth.oauth.${k}: required when AUTH_MODE=oauth (${env})`)
    else if (!httpUrl(v)) problems.push(`auth.oauth.${k}: must be an http(s) URL`)
  }
  if (!cfg.client_id) problems.push('auth.oauth.client_id: required when AUTH_MODE=oauth (OAUTH_CLIENT_ID)')
  if (!cfg.client_secret)
    problems.push('auth.oauth.client_secret: required when AUTH_MODE=oauth (OAUTH_CLIENT_SECRET)')
  if (cfg.frontend_url !== undefined && !httpUrl(cfg.frontend_url))
    problems.push('auth.oauth.frontend_url: must be an http(s) URL')
  if (cfg.admin_groups?.length === 0 && cfg.readonly_groups?.length === 0)
    problems.push('auth.oauth: admin_groups and readonly_groups cannot both be empty (nobody could log in)')
  return problems
}

/** oauthSettings applies the defaults; null when `oauthProblems` finds anything. */
export function oauthSettings(o: OAuthConfig | undefined): OAuthSettings | null {
  if (!o || oauthProblems(o).length > 0) return null
  const apiBaseUrl = trimSlash(o.api_base_url!)
  return {
    issuerUrl: o.issuer_url!,
    clientId: o.client_id!,
    clientSecret: o.client_secret!,
    k8sApiUrl: trimSlash(o.k8s_api_url!),
    apiBaseUrl,
    callbackUrl: `${apiBaseUrl}/api/auth/callback`,
    frontendUrl: o.frontend_url ?? `${apiBaseUrl}/`,
    scope: o.scope ?? 'user:info',
    adminGroups: o.admin_groups ?? ['service-admins'],
    readonlyGroups: o.readonly_groups ?? ['service-admins-readonly'],
    requestTimeoutMs: o.request_timeout_ms ?? 10_000,
  }
}

/** An OAuth failure: the AppError the route renders (page or controller JSON), and what to log. */
export class OAuthError extends AppError {
  constructor(
    status: number,
    code: string,
    message: string,
    /** reason: the detail for the log (never a code, token or secret). */
    readonly reason: string,
    /** The access-denied details, for its page. */
    readonly denied?: { username: string; groups: Record<OAuthRole, string[]> },
  ) {
    super(status, code, message)
    this.name = 'OAuthError'
    // The reason may quote the provider or the query string: one log line, bounded.
    this.reason = reason
      .replace(/[\u0000-\u001f\u007f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`)
      .slice(0, 500)
  }
}

/** What a successful callback yields: who logged in, and for how long the platform vouches. */
export interface OAuthUser {
  sub: string
  username: string
  roles: OAuthRole[]
  /** The provider's access-token lifetime, when it said (the JWT never outlives it). */
  providerExpiresIn?: number
}

/** LoginState: what the state cookie carries from the login to its callback (signed, short keys). */
export interface LoginState {
  /** state */
  s: string
  /** PKCE code verifier */
  v: string
  /** expiry, Unix ms */
  e: number
  /** the frontend's login nonce (LOGIN_NONCE), echoed back in the fragment with the token */
  n?: string
}

/**
 * The query parameter of `GET /api/auth/login`, and the fragment parameter of the callback's
 * redirect, that carry the frontend's login nonce: a random value the tab keeps before it leaves for
 * the provider, so it can accept a token only at the end of a login it began itself (a link with
 * someone else's token in the fragment is refused). At least 128 bits, base64url.
 */
export const LOGIN_NONCE = 'nonce'
const NONCE_FORM = /^[A-Za-z0-9_-]{22,128}$/

export interface OAuthFlowOptions {
  /** The HMAC key material of the state cookie (the JWT secret; a label derives a key of its own). */
  secret: string
  now?: () => number
}

/** isTimeout: the failure was a deadline (AbortSignal.timeout), looking through causes. */
function isTimeout(err: unknown): boolean {
  for (let e = err, i = 0; e && i < 5; e = (e as { cause?: unknown }).cause, i++)
    if (e instanceof Error && e.name === 'TimeoutError') return true
  return false
}

/** explain: an error's message and its cause's, for the log. */
function explain(err: unknown): string {
  if (!(err instanceof Error)) return String(err)
  const cause = err.cause instanceof Error ? `: ${err.cause.message}` : ''
  return `${err.message}${cause}`
}

export class OAuthFlow {
  private readonly key: Buffer
  private readonly now: () => number
  /** States already presented to the callback (single use, durable); set by the host once the store is open. */
  private used: UsedStates | null = null
  private metadata: { as: oauth.AuthorizationServer; until: number } | null = null
  private discovering: Promise<oauth.AuthorizationServer> | null = null
  /** Where the endpoints came from: the metadata document's URL, or `fallback`; null before the first login. */
  discoverySource: string | null = null

  constructor(
    readonly settings: OAuthSettings,
    opts: OAuthFlowOptions,
    private readonly log: (msg: string, fields: Record<string, unknown>) => void = () => {},
  ) {
    this.key = createHmac('sha256', opts.secret).update('modelgate/oauth-state/v1').digest()
    this.now = opts.now ?? Date.now
  }

  /** useStore keeps the used login states in the store, so single use survives a restart. */
  useStore(store: Store): void {
    this.used = new UsedStates(store.db)
  }

  private get client(): oauth.Client {
    return { client_id: this.settings.clientId }
  }

  /** Options of every oauth4webapi call: the deadline, and plain http only where configured so. */
  private http(url: string): { signal: () => AbortSignal; [oauth.allowInsecureRequests]?: boolean } {
    return {
      signal: () => AbortSignal.timeout(this.settings.requestTimeoutMs),
      ...(url.startsWith('http:') ? { [oauth.allowInsecureRequests]: true } : {}),
    }
  }

  /**
   * server: the provider's endpoints. RFC 8414 discovery (`/.well-known/oauth-authorization-server`)
   * at the issuer, then at the platform API (where OpenShift publishes it); the issuer named in the
   * answer must be OAUTH_ISSUER_URL. When neither answers 200, OpenShift's fixed endpoints under the
   * issuer (`/oauth/authorize`, `/oauth/token`). Kept for an hour; a failure is not kept.
   */
  async server(): Promise<oauth.AuthorizationServer> {
    const m = this.metadata
    if (m && m.until > this.now()) return m.as
    this.discovering ??= this.discover().finally(() => {
      this.discovering = null
    })
    return this.discovering
  }

  private async discover(): Promise<oauth.AuthorizationServer> {
    const { issuerUrl, k8sApiUrl } = this.settings
    const issuer = new URL(issuerUrl)
    const tried: string[] = []
    for (const base of [issuerUrl, k8sApiUrl]) {
      let res: Response
      try {
        res = await oauth.discoveryRequest(new URL(base), { algorithm: 'oauth2', ...this.http(base) })
      } catch (err) {
        // The issuer itself unreachable: nothing else will work either.
        if (base === issuerUrl) throw this.unreachable('the identity provider', issuerUrl, err)
        tried.push(`${base}: ${explain(err)}`)
        continue
      }
      if (res.status !== 200) {
        tried.push(`${base}: HTTP ${res.status}`)
        await res.body?.cancel()
        continue
      }
      try {
        const as = await oauth.processDiscoveryResponse(issuer, res)
        return this.keep(as, `${base}/.well-known/oauth-authorization-server`)
      } catch (err) {
        throw new OAuthError(
          502,
          'OAUTH_DISCOVERY_INVALID',
          'The identity provider published metadata modelgate cannot use; see the server log',
          `discovery at ${base}: ${explain(err)} (expected issuer ${issuerUrl})`,
        )
      }
    }
    const base = trimSlash(issuerUrl)
    this.log('oauth discovery did not answer; using the OpenShift endpoints under the issuer', {
      tried: tried.join('; '),
      authorization_endpoint: `${base}/oauth/authorize`,
    })
    return this.keep(
      {
        issuer: issuerUrl,
        authorization_endpoint: `${base}/oauth/authorize`,
        token_endpoint: `${base}/oauth/token`,
      },
      'fallback',
    )
  }

  private keep(as: oauth.AuthorizationServer, source: string): oauth.AuthorizationServer {
    this.metadata = { as, until: this.now() + 3600_000 }
    this.discoverySource = source
    return as
  }

  private unreachable(what: string, url: string, err: unknown): OAuthError {
    return isTimeout(err)
      ? new OAuthError(
          504,
          'OAUTH_PROVIDER_TIMEOUT',
          `${cap(what)} did not answer within ${this.settings.requestTimeoutMs} ms; try again later`,
          `${url}: no answer within ${this.settings.requestTimeoutMs} ms`,
        )
      : new OAuthError(
          502,
          'OAUTH_PROVIDER_UNAVAILABLE',
          `${cap(what)} cannot be reached; try again later`,
          `${url}: ${explain(err)}`,
        )
  }

  /**
   * start: the provider's authorization URL to redirect to, and the state cookie to set. `nonce`
   * (the frontend's, optional) is sealed in the cookie and handed back with the token.
   */
  async start(nonce?: string | null): Promise<{ location: string; cookie: string }> {
    if (nonce != null && !NONCE_FORM.test(nonce))
      throw new OAuthError(
        400,
        'OAUTH_LOGIN_INVALID',
        `The login's ${LOGIN_NONCE} must be 22 to 128 characters of A-Z, a-z, 0-9, - and _`,
        `malformed ${LOGIN_NONCE} (${nonce.length} characters)`,
      )
    const as = await this.server()
    const state = oauth.generateRandomState()
    const verifier = oauth.generateRandomCodeVerifier()
    const url = new URL(as.authorization_endpoint!)
    url.searchParams.set('client_id', this.settings.clientId)
    url.searchParams.set('redirect_uri', this.settings.callbackUrl)
    url.searchParams.set('response_type', 'code')
    url.searchParams.set('scope', this.settings.scope)
    url.searchParams.set('state', state)
    url.searchParams.set('code_challenge', await oauth.calculatePKCECodeChallenge(verifier))
    url.searchParams.set('code_challenge_method', 'S256')
    const sealed = this.seal({
      s: state,
      v: verifier,
      e: this.now() + STATE_TTL_SECONDS * 1000,
      ...(nonce ? { n: nonce } : {}),
    })
    return { location: url.href, cookie: this.cookie(sealed, STATE_TTL_SECONDS) }
  }

  /** clearCookie: the Set-Cookie value that removes the state cookie (every callback sends it). */
  clearCookie(): string {
    return this.cookie('', 0)
  }

  private cookie(value: string, maxAge: number): string {
    const path = new URL(this.settings.callbackUrl).pathname
    const secure = this.settings.callbackUrl.startsWith('https:') ? '; Secure' : ''
    return `${STATE_COOKIE}=${value}; Path=${path}; HttpOnly; SameSite=Lax; Max-Age=${maxAge}${secure}`
  }

  private seal(s: LoginState): string {
    const body = Buffer.from(JSON.stringify(s)).toString('base64url')
    return `${body}.${createHmac('sha256', this.key).update(body).digest('base64url')}`
  }

  private unseal(value: string): LoginState | null {
    const [body, mac, extra] = value.split('.')
    if (!body || !mac || extra !== undefined) return null
    const want = createHmac('sha256', this.key).update(body).digest()
    const got = Buffer.from(mac, 'base64url')
    if (got.length !== want.length || !timingSafeEqual(got, want)) return null
    try {
      const s = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as LoginState
      return typeof s.s === 'string' &&
        typeof s.v === 'string' &&
        typeof s.e === 'number' &&
        (s.n === undefined || typeof s.n === 'string')
        ? s
        : null
    } catch {
      return null
    }
  }

  /**
   * checkState: the callback's `state` against the browser's cookie. Refused when the cookie is
   * missing or forged, the login is older than STATE_TTL_SECONDS, the states differ, or the state
   * was presented before (single use, whatever happened next).
   */
  checkState(query: URLSearchParams, cookieHeader: string | null): LoginState {
    const invalid = (reason: string, message = 'This login link is not valid in this browser.') =>
      new OAuthError(400, 'OAUTH_STATE_INVALID', `${message} Start the login again.`, reason)
    const state = query.get('state')
    if (!state) throw invalid('callback without state')
    const raw = cookieValue(cookieHeader, STATE_COOKIE)
    if (!raw) throw invalid('no login cookie (expired, cleared, or the login started in another browser)')
    const sealed = this.unseal(raw)
    if (!sealed) throw invalid('login cookie forged or corrupt')
    const now = this.now()
    if (sealed.e <= now)
      throw new OAuthError(
        400,
        'OAUTH_STATE_EXPIRED',
        `This login took longer than ${STATE_TTL_SECONDS / 60} minutes. Start the login again.`,
        'login cookie expired',
      )
    const a = Buffer.from(state)
    const b = Buffer.from(sealed.s)
    if (a.length !== b.length || !timingSafeEqual(a, b))
      throw invalid('state does not match the login cookie')
    if (!this.used)
      throw new OAuthError(
        503,
        'OAUTH_NOT_READY',
        'The server is starting; try again',
        'no store for login states yet',
      )
    if (!this.used.consume(sealed.s, sealed.e, now))
      throw invalid('state already used (a replayed callback)', 'This login link has already been used.')
    return sealed
  }

  /**
   * finish runs the callback once `checkState` has accepted its state: provider error, code
   * exchange, user lookup, role mapping.
   */
  async finish(query: URLSearchParams, sealed: LoginState): Promise<OAuthUser> {
    const as = await this.server()
    let params: URLSearchParams
    try {
      params = oauth.validateAuthResponse(as, this.client, query, sealed.s)
    } catch (err) {
      if (err instanceof oauth.AuthorizationResponseError)
        throw new OAuthError(
          401,
          'OAUTH_PROVIDER_ERROR',
          `The identity provider did not log you in: ${err.error}${err.error_description ? ` (${err.error_description})` : ''}`,
          `provider error ${err.error}: ${err.error_description ?? ''}`,
        )
      throw new OAuthError(400, 'OAUTH_CALLBACK_INVALID', 'The login answer is not valid', explain(err))
    }
    if (!params.get('code'))
      throw new OAuthError(
        400,
        'OAUTH_CALLBACK_INVALID',
        'The login answer carries no code',
        'callback without code',
      )
    const tokens = await this.exchange(as, params, sealed.v)
    const user = await this.fetchUser(tokens.access_token)
    return tokens.expires_in ? { ...user, providerExpiresIn: tokens.expires_in } : user
  }

  private async exchange(
    as: oauth.AuthorizationServer,
    params: URLSearchParams,
    verifier: string,
  ): Promise<oauth.TokenEndpointResponse> {
    const methods = as.token_endpoint_auth_methods_supported
    const auth =
      methods?.includes('client_secret_post') && !methods.includes('client_secret_basic')
        ? oauth.ClientSecretPost(this.settings.clientSecret)
        : oauth.ClientSecretBasic(this.settings.clientSecret)
    const endpoint = as.token_endpoint!
    let res: Response
    try {
      res = await oauth.authorizationCodeGrantRequest(
        as,
        this.client,
        auth,
        params,
        this.settings.callbackUrl,
        verifier,
        this.http(endpoint),
      )
    } catch (err) {
      if (err instanceof oauth.OperationProcessingError)
        throw new OAuthError(
          502,
          'OAUTH_PROVIDER_FAILED',
          'The identity provider cannot complete the login; see the server log',
          `token request to ${endpoint}: ${explain(err)}`,
        )
      throw this.unreachable('the identity provider', endpoint, err)
    }
    try {
      return await oauth.processAuthorizationCodeResponse(as, this.client, res)
    } catch (err) {
      if (err instanceof oauth.ResponseBodyError && err.status < 500)
        throw new OAuthError(
          401,
          'OAUTH_CODE_REJECTED',
          'The identity provider refused the login code (it may have expired or been used). Start the login again.',
          `token endpoint ${err.status} ${err.error}: ${err.error_description ?? ''}`,
        )
      if (isTimeout(err)) throw this.unreachable('the identity provider', endpoint, err)
      throw new OAuthError(
        502,
        'OAUTH_PROVIDER_FAILED',
        'The identity provider failed to complete the login; try again later',
        `token endpoint (HTTP ${res.status}): ${explain(err)}`,
      )
    }
  }

  /** fetchUser asks the platform who the access token belongs to and which groups they are in. */
  private async fetchUser(accessToken: string): Promise<OAuthUser> {
    const url = `${this.settings.k8sApiUrl}${USER_PATH}`
    const failed = (reason: string) =>
      new OAuthError(
        502,
        'OAUTH_USER_LOOKUP_FAILED',
        'The platform did not say who you are; try again later',
        `${url}: ${reason}`,
      )
    let body: unknown
    try {
      const res = await fetch(url, {
        headers: { authorization: `Bearer ${accessToken}`, accept: 'application/json' },
        redirect: 'manual',
        signal: AbortSignal.timeout(this.settings.requestTimeoutMs),
      })
      if (res.status !== 200) {
        await res.body?.cancel()
        throw failed(`HTTP ${res.status}`)
      }
      body = await res.json()
    } catch (err) {
      if (err instanceof OAuthError) throw err
      if (isTimeout(err))
        throw new OAuthError(
          504,
          'OAUTH_USER_LOOKUP_TIMEOUT',
          `The platform did not say who you are within ${this.settings.requestTimeoutMs} ms; try again later`,
          `${url}: no answer within ${this.settings.requestTimeoutMs} ms`,
        )
      throw failed(explain(err))
    }
    const u = body as { metadata?: { name?: unknown; uid?: unknown }; groups?: unknown }
    const name = u?.metadata?.name
    if (typeof name !== 'string' || name === '') throw failed('answer has no metadata.name')
    const groups = Array.isArray(u.groups) ? u.groups.filter((g): g is string => typeof g === 'string') : []
    const roles = this.rolesOf(groups)
    if (roles.length === 0)
      throw new OAuthError(
        403,
        'ACCESS_DENIED',
        `User '${name}' is in none of the groups that grant access: ${this.settings.adminGroups.join(', ')} (admin), ${this.settings.readonlyGroups.join(', ')} (admin-readonly)`,
        `user ${name} has no admin group (groups: ${groups.join(', ') || 'none'})`,
        {
          username: name,
          groups: { admin: this.settings.adminGroups, 'admin-readonly': this.settings.readonlyGroups },
        },
      )
    const uid = u.metadata?.uid
    return { sub: typeof uid === 'string' && uid !== '' ? uid : name, username: name, roles }
  }

  /** rolesOf maps group names to roles: every role some group grants. */
  rolesOf(groups: readonly string[]): OAuthRole[] {
    const roles: OAuthRole[] = []
    if (groups.some((g) => this.settings.adminGroups.includes(g))) roles.push('admin')
    if (groups.some((g) => this.settings.readonlyGroups.includes(g))) roles.push('admin-readonly')
    return roles
  }
}

function cap(s: string): string {
  return s.charAt(0).toUpperCase() + s.slice(1)
}

/** cookieValue reads one cookie from a Cookie header. */
export function cookieValue(header: string | null, name: string): string | null {
  if (!header) return null
  for (const part of header.split(';')) {
    const i = part.indexOf('=')
    if (i > 0 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim()
  }
  return null
}
