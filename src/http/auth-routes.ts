import { Elysia, t } from 'elysia'
import { PEER_HEADER } from '../wire/headers.ts'
import { principalOf } from './app.ts'
import type { AuthService } from './auth.ts'
import { AppError, unauthorized } from './errors.ts'
import { LOGIN_NONCE, OAuthError } from './oauth.ts'
import { accessDeniedPage, failurePage, PAGE_HEADERS, wantsHtml } from './oauth-page.ts'
import { ControllerError } from './schemas.ts'

/**
 * authRoutes: `/api/auth/*`, public by their prefix (categorize). Simple mode logs in with
 * `POST /login`; OAuth mode with the browser redirect pair `GET /login` → provider →
 * `GET /callback` → frontend with the JWT in the URL fragment (src/http/oauth.ts). Every OAuth
 * failure is logged once here, and answered with a page (a browser) or the controller JSON shape
 * (anything that does not ask for HTML), never a 500.
 */
const UserInfo = t.Object({
  sub: t.String(),
  username: t.String(),
  roles: t.Array(t.String()),
  authMode: t.String(),
  exp: t.Optional(t.Number()),
})

const AuthInfo = t.Object({
  mode: t.String(),
  auth_enabled: t.Boolean(),
  login_url: t.Nullable(t.String()),
  login_method: t.Nullable(t.String()),
  inference_api_key_required: t.Boolean(),
  token_lifetime_seconds: t.Nullable(t.Number()),
  roles: t.Array(t.String()),
  oauth: t.Nullable(
    t.Object({
      issuer_url: t.String(),
      callback_url: t.String(),
      frontend_url: t.String(),
      token_fragment_parameter: t.String(),
      groups: t.Object({ admin: t.Array(t.String()), 'admin-readonly': t.Array(t.String()) }),
    }),
  ),
})

const TITLES: Record<number, string> = {
  400: 'Login link not valid',
  401: 'Login failed',
  403: 'Access denied',
  502: 'Login unavailable',
  503: 'Login not configured',
  504: 'Login timed out',
}

export function authRoutes(auth: AuthService) {
  /** retryUrl: the login again, with the frontend's nonce when the failed login carried one (same tab, same nonce). */
  const retryUrl = (nonce?: string) =>
    `${auth.oauth?.settings.apiBaseUrl ?? ''}/api/auth/login${nonce ? `?${LOGIN_NONCE}=${nonce}` : ''}`

  /** oauthFlow: the OAuth client, or the reason there is none (not OAuth mode, or incomplete config). */
  const oauthFlow = () => {
    if (auth.mode !== 'oauth')
      throw new AppError(
        400,
        'OAUTH_NOT_ENABLED',
        `OAuth login is not available when AUTH_MODE=${auth.mode}${auth.mode === 'simple' ? ' (log in with POST /api/auth/login)' : ''}`,
      )
    if (!auth.oauth)
      throw new OAuthError(
        503,
        'OAUTH_NOT_CONFIGURED',
        'OAuth login is not configured on this server; the server log names what is missing',
        auth.oauthProblems.join('; ') || 'auth.jwt_secret: required',
      )
    return auth.oauth
  }

  /** fail renders a login failure for a browser (page) or an API client (JSON), logging it once. */
  const fail = (err: unknown, request: Request, extra: Record<string, string>, nonce?: string): Response => {
    const e =
      err instanceof AppError
        ? err
        : new OAuthError(
            502,
            'OAUTH_LOGIN_FAILED',
            'The login could not be completed; try again later',
            err instanceof Error ? (err.stack ?? err.message) : String(err),
          )
    if (e instanceof OAuthError)
      auth.logger?.write(e.status >= 500 ? 'error' : 'warn', 'oauth login failed', {
        code: e.code,
        status: e.status,
        reason: e.reason,
      })
    if (!wantsHtml(request)) {
      const res = e.toResponse('controller')
      for (const [k, v] of Object.entries({ ...PAGE_HEADERS, ...extra })) res.headers.set(k, v)
      return res
    }
    const html =
      e instanceof OAuthError && e.denied
        ? accessDeniedPage({ ...e.denied, retryUrl: retryUrl(nonce) })
        : failurePage(TITLES[e.status] ?? 'Login failed', e.message, e.code, retryUrl(nonce))
    return new Response(html, {
      status: e.status,
      headers: { ...PAGE_HEADERS, ...extra, 'content-type': 'text/html; charset=utf-8' },
    })
  }

  return new Elysia({ name: 'auth-routes' }).group('/api/auth', (g) =>
    g
      .get('/info', () => auth.info(), {
        detail: {
          tags: ['auth'],
          summary: 'Auth mode and how to log in',
          description:
            'In OAuth mode `oauth` says where the browser comes back (`frontend_url`, with ' +
            '`#token=<JWT>&token_type=Bearer&expires_in=<s>` in the fragment, and `&nonce=` with the nonce the ' +
            'login was started with, if any) and which groups grant which role.',
        },
        response: AuthInfo,
      })
      .post(
        '/login',
        ({ body, request }) =>
          auth.login(body.username, body.password, request.headers.get(PEER_HEADER) ?? 'unknown'),
        {
          body: t.Object({ username: t.String({ minLength: 1 }), password: t.String({ minLength: 1 }) }),
          detail: {
            tags: ['auth'],
            summary: 'Simple-mode login',
            description:
              'Returns an HS256 JWT (claims iss `modelgate`, aud `modelgate-admin`, sub, username, roles, ' +
              'authMode, iat, exp, jti). Each client ' +
              'address may try `server.login_attempts_per_minute` times a minute; beyond, 429 with Retry-After.',
          },
          response: {
            200: t.Object({
              token: t.String(),
              token_type: t.Literal('Bearer'),
              expires_at: t.String(),
              expires_in: t.Number(),
              user: t.Object({ username: t.String(), roles: t.Array(t.String()) }),
            }),
            400: ControllerError,
            401: ControllerError,
            429: ControllerError,
          },
        },
      )
      .get(
        '/login',
        async ({ request }) => {
          try {
            const flow = oauthFlow()
            const nonces = new URL(request.url).searchParams.getAll(LOGIN_NONCE)
            if (nonces.length > 1)
              throw new OAuthError(
                400,
                'OAUTH_LOGIN_INVALID',
                `The login takes one ${LOGIN_NONCE}, not ${nonces.length}`,
                `${nonces.length} ${LOGIN_NONCE} parameters`,
              )
            const { location, cookie } = await flow.start(nonces[0])
            return new Response(null, {
              status: 302,
              headers: { ...PAGE_HEADERS, location, 'set-cookie': cookie },
            })
          } catch (err) {
            return fail(err, request, {})
          }
        },
        {
          query: t.Object({
            [LOGIN_NONCE]: t.Optional(
              t.String({
                description:
                  "The frontend's login nonce (22-128 base64url characters, at least 128 random bits): " +
                  'handed back beside the token in the fragment, so the page accepts only a token from a ' +
                  'login it began. 400 `OAUTH_LOGIN_INVALID` when malformed.',
              }),
            ),
          }),
          detail: {
            tags: ['auth'],
            summary: 'OAuth login: redirect to the identity provider',
            description:
              "OAuth mode only (400 `OAUTH_NOT_ENABLED` otherwise). 302 to the provider's authorization endpoint " +
              'with `state` and a PKCE challenge; `state`, the verifier and the nonce travel in a signed, HttpOnly ' +
              'cookie that expires after 10 minutes. 502/504 when the provider cannot be reached.',
          },
        },
      )
      .get(
        '/callback',
        async ({ request }) => {
          let clear: Record<string, string> = {}
          let nonce: string | undefined
          try {
            const flow = oauthFlow()
            clear = { 'set-cookie': flow.clearCookie() }
            const query = new URL(request.url).searchParams
            const login = flow.checkState(query, request.headers.get('cookie'))
            nonce = login.n
            const user = await flow.finish(query, login)
            const issued = await auth.issueOAuthToken(user)
            auth.logger?.info('oauth login', { username: user.username, roles: user.roles.join(',') })
            const to = new URL(flow.settings.frontendUrl)
            to.hash = new URLSearchParams({
              token: issued.token,
              token_type: 'Bearer',
              expires_in: String(issued.expires_in),
              ...(nonce ? { [LOGIN_NONCE]: nonce } : {}),
            }).toString()
            return new Response(null, {
              status: 302,
              headers: { ...PAGE_HEADERS, ...clear, location: to.href },
            })
          } catch (err) {
            return fail(err, request, clear, nonce)
          }
        },
        {
          detail: {
            tags: ['auth'],
            summary: 'OAuth callback: issues the JWT',
            description:
              'The provider sends the browser here with `code` and `state`. The state must match the login ' +
              'cookie and is single use (remembered until it expires, across restarts); the code is exchanged, ' +
              "the user's groups read from the platform (`/apis/user.openshift.io/v1/users/~`) and mapped to " +
              'roles. Success: 302 to the frontend with ' +
              '`#token=<JWT>&token_type=Bearer&expires_in=<s>`, plus `&nonce=<n>` when the login was started ' +
              'with one. A user in none of the groups gets the ' +
              'access-denied page (403, no token). Failures: 400 bad, expired or reused state; 401 provider ' +
              'error or code refused; 502/504 provider or platform down or slow. A browser gets a page, ' +
              'other clients the controller error shape.',
          },
        },
      )
      .get(
        '/me',
        async ({ request }) => {
          if (auth.mode === 'none')
            return { sub: 'anonymous', username: 'anonymous', roles: ['admin'], authMode: 'none' }
          return principalOf(request) ?? (await auth.adminPrincipal(request, '/api/auth/me'))
        },
        {
          detail: {
            tags: ['auth'],
            summary: 'Current user',
            description: 'With AUTH_MODE=none everyone is an anonymous admin.',
            security: [{ adminJwt: [] }],
          },
          response: { 200: UserInfo, 401: ControllerError },
        },
      )
      .post(
        '/logout',
        async ({ request }) => {
          if (auth.mode !== 'none') {
            const principal = await auth.adminPrincipal(request, '/api/auth/logout').catch(() => {
              throw unauthorized()
            })
            auth.revoke(principal)
          }
          return { success: true, message: 'Logged out; the token is revoked until it expires' }
        },
        {
          detail: {
            tags: ['auth'],
            summary: 'Log out',
            description:
              'Revokes the presented token until its exp (kept in the data dir, so across restarts; in a ' +
              'cluster every pod refuses it) and tells the client to discard it. ' +
              "In OAuth mode the provider's own session is left as it is.",
            security: [{ adminJwt: [] }],
          },
          response: { 200: t.Object({ success: t.Boolean(), message: t.String() }), 401: ControllerError },
        },
      ),
  )
}
