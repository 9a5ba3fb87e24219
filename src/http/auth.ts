import { createHash, randomUUID, timingSafeEqual } from 'node:crypto'
import { jwt } from '@elysiajs/jwt'
import type { RootConfig } from '../config/schema.ts'
import { AppError, forbidden, proxyError, unauthorized } from './errors.ts'

/**
 * AuthService is the one guard for every route: it sorts a path into the spec's categories
 * (public, admin, inference, internal) and checks what that category requires. Routes never check
 * auth themselves. Roles ride on every admin request (`admin` for writes, `admin-readonly` may read),
 * the seam OAuth group mapping plugs into.
 */
export type Role = 'admin' | 'admin-readonly'
export type RouteCategory = 'public' | 'admin' | 'inference' | 'internal'
export type AuthConfig = RootConfig['auth']

export interface Principal {
  sub: string
  username: string
  roles: Role[]
  authMode: string
  exp?: number
  jti?: string
}

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

/** categorize maps a request path to its auth category (spec: Authentication, route categories). */
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

/** READ_ONLY_POSTS are POSTs that change nothing (they carry a query body), open to admin-readonly. */
const READ_ONLY_POSTS = new Set(['/api/memory/profiles/check'])

/** requiredRole: reads may be done by admin-readonly, everything that changes state needs admin. */
export function requiredRole(method: string, pathname = ''): Role {
  if (method === 'GET' || method === 'HEAD') return 'admin-readonly'
  return method === 'POST' && READ_ONLY_POSTS.has(pathname) ? 'admin-readonly' : 'admin'
}

function sha256(s: string): Buffer {
  return createHash('sha256').update(s).digest()
}

/** safeEqual compares secrets in constant time (hashing first so lengths do not leak). */
export function safeEqual(a: string, b: string): boolean {
  return timingSafeEqual(sha256(a), sha256(b))
}

function bearer(req: Request): string | null {
  return bearerOf(req.headers.get('authorization'))
}

function bearerOf(h: string | null): string | null {
  if (!h) return null
  const m = /^Bearer\s+(.+)$/i.exec(h.trim())
  return m ? m[1]!.trim() : null
}

export interface LoginResult {
  token: string
  token_type: 'Bearer'
  expires_at: string
  expires_in: number
  user: { username: string; roles: Role[] }
}

export class AuthService {
  readonly mode: AuthConfig['mode']
  private readonly signer: {
    sign(p: Record<string, unknown>): Promise<string>
    verify(t: string, o: unknown): Promise<unknown>
  } | null
  /** revoked holds logged-out token ids until they expire (in memory: a restart forgets them). */
  private readonly revoked = new Map<string, number>()

  constructor(private readonly cfg: AuthConfig) {
    this.mode = cfg.mode
    this.signer = cfg.jwt_secret
      ? (jwt({ name: 'jwt', secret: cfg.jwt_secret, alg: 'HS256' }).decorator
          .jwt as unknown as AuthService['signer'])
      : null
  }

  get inferenceKeyRequired(): boolean {
    return !!this.cfg.inference_api_key
  }

  info() {
    return {
      mode: this.mode,
      auth_enabled: this.mode !== 'none',
      login_url:
        this.mode === 'oauth' ? '/api/auth/login' : this.mode === 'simple' ? '/api/auth/login' : null,
      login_method: this.mode === 'oauth' ? 'GET' : this.mode === 'simple' ? 'POST' : null,
      inference_api_key_required: this.inferenceKeyRequired,
      token_lifetime_seconds: this.mode === 'none' ? null : this.cfg.jwt_ttl_seconds,
      roles: ['admin', 'admin-readonly'],
    }
  }

  async issueToken(username: string, roles: Role[]): Promise<LoginResult> {
    if (!this.signer) throw new AppError(400, 'AUTH_DISABLED', 'Authentication is disabled (AUTH_MODE=none)')
    const now = Math.floor(Date.now() / 1000)
    const exp = now + this.cfg.jwt_ttl_seconds
    const token = await this.signer.sign({
      sub: username,
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
      expires_in: this.cfg.jwt_ttl_seconds,
      user: { username, roles },
    }
  }

  /** login checks simple-mode credentials in constant time and returns a JWT. */
  async login(username: string, password: string): Promise<LoginResult> {
    if (this.mode !== 'simple')
      throw new AppError(
        400,
        'LOGIN_NOT_AVAILABLE',
        `Password login is not available when AUTH_MODE=${this.mode}`,
      )
    const userOk = safeEqual(username, this.cfg.admin_username)
    const passOk = safeEqual(password, this.cfg.admin_password ?? '')
    if (!(userOk && passOk)) throw unauthorized('Invalid username or password')
    return this.issueToken(username, ['admin'])
  }

  /** verifyToken accepts only HS256 tokens with an exp claim, a valid signature and known roles. */
  async verifyToken(token: string): Promise<Principal> {
    if (!this.signer) throw unauthorized()
    const header = decodeHeader(token)
    if (header?.alg !== 'HS256') throw unauthorized('Invalid token: algorithm must be HS256')
    const payload = (await this.signer.verify(token, { algorithms: ['HS256'], requiredClaims: ['exp'] })) as
      | Record<string, unknown>
      | false
    if (!payload) throw unauthorized('Invalid or expired token')
    const { sub, username, roles, authMode, exp, jti } = payload
    if (typeof sub !== 'string' || typeof exp !== 'number' || !Array.isArray(roles))
      throw unauthorized('Invalid token: missing claims')
    if (typeof jti === 'string' && this.revoked.has(jti)) throw unauthorized('Token has been revoked')
    const known = roles.filter((r): r is Role => r === 'admin' || r === 'admin-readonly')
    return {
      sub,
      username: typeof username === 'string' ? username : sub,
      roles: known,
      authMode: typeof authMode === 'string' ? authMode : this.mode,
      exp,
      ...(typeof jti === 'string' ? { jti } : {}),
    }
  }

  revoke(principal: Principal): void {
    if (!principal.jti || !principal.exp) return
    const nowSec = Date.now() / 1000
    for (const [id, exp] of this.revoked) if (exp < nowSec) this.revoked.delete(id)
    this.revoked.set(principal.jti, principal.exp)
  }

  /** adminPrincipal authenticates a controller request (header, or `?token=` on event streams). */
  async adminPrincipal(req: Request, url: URL): Promise<Principal> {
    if (this.mode === 'none') return ANONYMOUS_ADMIN
    let token = bearer(req)
    if (!token && url.pathname.endsWith('/events')) token = url.searchParams.get('token')
    if (!token) throw unauthorized('Missing bearer token')
    return this.verifyToken(token)
  }

  /** checkInference enforces INFERENCE_API_KEY (proxy error shape). The admin JWT is not accepted. */
  checkInference(req: Request): AppError | null {
    return this.checkInferenceKey(req.headers.get('authorization'))
  }

  /** checkInferenceKey is checkInference for a request parsed by the wire front (its Authorization value). */
  checkInferenceKey(authorization: string | null): AppError | null {
    const key = this.cfg.inference_api_key
    if (!key) return null
    const given = bearerOf(authorization)
    if (!given)
      return proxyError(
        401,
        'authentication_error',
        'missing_api_key',
        'Missing API key: send Authorization: Bearer <API_KEY>',
      )
    if (!safeEqual(given, key))
      return proxyError(401, 'authentication_error', 'invalid_api_key', 'Invalid API key')
    return null
  }

  /**
   * guard is the single check every request passes. It returns the principal for admin routes,
   * null for public and inference routes, or throws an AppError rendered in the right shape.
   */
  async guard(req: Request, url: URL): Promise<Principal | null> {
    const category = categorize(url.pathname)
    if (category === 'public') return null
    if (category === 'inference') {
      const err = this.checkInference(req)
      if (err) throw err
      return null
    }
    if (category === 'internal') {
      // The cluster plugin verifies its HMAC signature itself; without it there is no internal API.
      return null
    }
    if (req.method === 'OPTIONS') return null
    const principal = await this.adminPrincipal(req, url)
    const need = requiredRole(req.method, url.pathname)
    const ok =
      principal.roles.includes('admin') || (need === 'admin-readonly' && principal.roles.includes(need))
    if (!ok) throw forbidden(need === 'admin' ? 'admin' : 'admin-readonly')
    return principal
  }
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
