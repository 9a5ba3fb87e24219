import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { Events, OAuth2Server } from 'oauth2-mock-server'

/**
 * OAuth test kit: a real OAuth 2 provider (oauth2-mock-server: discovery, authorization endpoint with
 * PKCE, token endpoint) whose next login is whoever `user` names; a stand-in for the platform's
 * current-user endpoint (`/apis/user.openshift.io/v1/users/~`) that can answer, fail, hang or
 * reset; and a browser that follows nothing by itself and keeps cookies per host.
 */
export interface Provider {
  server: OAuth2Server
  issuer: string
  /** The user the next access token is issued for (its `sub`). */
  user: string
  stop(): Promise<void>
}

/**
 * startProvider: `rfc8414` publishes `/.well-known/oauth-authorization-server` and serves
 * `/authorize` and `/token`; `openshift` publishes no RFC 8414 document and serves OpenShift's
 * `/oauth/authorize` and `/oauth/token` (what modelgate falls back to).
 */
export async function startProvider(kind: 'rfc8414' | 'openshift'): Promise<Provider> {
  const server = new OAuth2Server(undefined, undefined, {
    endpoints:
      kind === 'rfc8414'
        ? { wellKnownDocument: '/.well-known/oauth-authorization-server' }
        : { authorize: '/oauth/authorize', token: '/oauth/token' },
  })
  await server.issuer.keys.generate('RS256')
  await server.start(0, '127.0.0.1')
  const p: Provider = {
    server,
    issuer: server.issuer.url!,
    user: 'nobody',
    stop: () => server.stop(),
  }
  server.service.on(Events.BeforeTokenSigning, (token) => {
    token.payload.sub = p.user
  })
  return p
}

export interface PlatformUser {
  uid: string
  groups: string[]
}

export type PlatformMode =
  | { kind: 'ok' }
  | { kind: 'status'; status: number }
  /** hang: never answers until release() (a slow platform; the gateway's deadline must end it). */
  | { kind: 'hang' }
  /** reset: closes the connection without an answer (the platform down). */
  | { kind: 'reset' }

export interface Platform {
  url: string
  users: Record<string, PlatformUser>
  mode: PlatformMode
  /** metadata: served at /.well-known/oauth-authorization-server when set (else 404). */
  metadata: Record<string, unknown> | null
  /** Bearer tokens the user endpoint was called with. */
  tokens: string[]
  /** Requests held by `hang`. */
  readonly held: number
  release(): void
  stop(): Promise<void>
}

function payloadOf(jwt: string): Record<string, unknown> | null {
  try {
    return JSON.parse(Buffer.from(jwt.split('.')[1] ?? '', 'base64url').toString('utf8'))
  } catch {
    return null
  }
}

/** startPlatform: the platform API stand-in; the user is the `sub` of the bearer token. */
export async function startPlatform(users: Record<string, PlatformUser>): Promise<Platform> {
  const held: ServerResponse[] = []
  const send = (res: ServerResponse, status: number, body: unknown) => {
    res.writeHead(status, { 'content-type': 'application/json' })
    res.end(JSON.stringify(body))
  }
  const handle = (req: IncomingMessage, res: ServerResponse) => {
    const path = (req.url ?? '').split('?')[0]
    if (path === '/.well-known/oauth-authorization-server') {
      if (p.metadata) send(res, 200, p.metadata)
      else send(res, 404, { kind: 'Status', code: 404 })
      return
    }
    if (path !== '/apis/user.openshift.io/v1/users/~') return send(res, 404, { kind: 'Status', code: 404 })
    const m = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')
    if (m) p.tokens.push(m[1]!)
    const mode = p.mode
    if (mode.kind === 'reset') return req.socket.destroy()
    if (mode.kind === 'hang') return void held.push(res)
    if (mode.kind === 'status') return send(res, mode.status, { kind: 'Status', code: mode.status })
    const sub = m ? payloadOf(m[1]!)?.sub : undefined
    const user = typeof sub === 'string' ? p.users[sub] : undefined
    if (!user) return send(res, 401, { kind: 'Status', code: 401, message: 'Unauthorized' })
    send(res, 200, {
      kind: 'User',
      apiVersion: 'user.openshift.io/v1',
      metadata: { name: sub, uid: user.uid },
      identities: [`htpasswd:${sub}`],
      groups: user.groups,
    })
  }
  const server = createServer(handle)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as AddressInfo).port
  const p: Platform = {
    url: `http://127.0.0.1:${port}`,
    users,
    mode: { kind: 'ok' },
    metadata: null,
    tokens: [],
    get held() {
      return held.length
    },
    release() {
      for (const res of held.splice(0)) if (!res.destroyed) send(res, 503, { kind: 'Status', code: 503 })
    },
    stop() {
      p.release()
      server.closeAllConnections()
      return new Promise((resolve) => server.close(() => resolve()))
    },
  }
  return p
}

/**
 * Browser: GETs one URL at a time (redirects are returned, not followed), sends `accept: text/html`
 * like a navigation unless told otherwise, and keeps cookies per host (Max-Age=0 deletes).
 * `map` rewrites a URL before it is fetched (the public API_BASE_URL to the test listener).
 */
export class Browser {
  readonly jar = new Map<string, Map<string, string>>()
  constructor(private readonly map: (url: string) => string = (u) => u) {}

  async get(url: string, accept = 'text/html,application/xhtml+xml'): Promise<Response> {
    const target = this.map(url)
    const host = new URL(target).host
    const cookies = this.jar.get(host)
    const headers: Record<string, string> = { accept }
    if (cookies?.size) headers.cookie = [...cookies].map(([k, v]) => `${k}=${v}`).join('; ')
    const res = await fetch(target, { redirect: 'manual', headers })
    for (const line of res.headers.getSetCookie()) {
      const [pair = '', ...attrs] = line.split(';')
      const i = pair.indexOf('=')
      const name = pair.slice(0, i).trim()
      const jar = this.jar.get(host) ?? new Map<string, string>()
      this.jar.set(host, jar)
      if (attrs.some((a) => a.trim().toLowerCase() === 'max-age=0')) jar.delete(name)
      else jar.set(name, pair.slice(i + 1).trim())
    }
    return res
  }

  /** clone: another browser with a copy of this one's cookies (an attacker who copied them). */
  clone(): Browser {
    const b = new Browser(this.map)
    for (const [h, c] of this.jar) b.jar.set(h, new Map(c))
    return b
  }
}

/** fragmentOf reads the parameters of a URL's fragment (`#token=…&expires_in=…`). */
export function fragmentOf(url: string): URLSearchParams {
  return new URLSearchParams(new URL(url).hash.slice(1))
}

/** claimsOf decodes a JWT's payload (no verification: the gateway verifies its own tokens). */
export function claimsOf(jwt: string): Record<string, unknown> {
  return payloadOf(jwt) ?? {}
}
