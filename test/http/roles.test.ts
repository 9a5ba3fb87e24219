import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Role } from '../../src/http/auth.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'

/**
 * The role walk: a host with every plugin, in simple mode with an inference key, read through its
 * own OpenAPI document (/docs/json). Every operation there is called with no token, an
 * admin-readonly token and an admin token (and, for inference routes, the key), and must answer as
 * the operation declares (`x-auth`, `x-required-role`) AND as the spec's permission table says
 * (SPEC below, written from gateway-api.md). Routes nobody listed here (new ones included) are judged
 * by the spec's general rules: a view (GET) is for both roles, anything that changes state is admin.
 */

type Need = 'public' | 'any-role' | 'admin-readonly' | 'admin' | 'either' | 'inference' | 'internal'

/**
 * SPEC: gateway-api.md, "Endpoints" (categories in each section's title) and "Authentication"
 * (route categories, permissions table). `admin-readonly` = both roles; `admin` = admin only.
 */
const SPEC: [method: string, path: string, need: Need, why: string][] = [
  // Model lifecycle (admin)
  ['POST', '/api/v1/models/load', 'admin', 'Load or unload models: admin only'],
  ['GET', '/api/v1/models', 'admin-readonly', 'View models'],
  ['GET', '/api/v1/models/{id}', 'admin-readonly', 'View models'],
  ['POST', '/api/v1/models/{id}/unload', 'admin', 'Load or unload models: admin only'],
  ['GET', '/api/v1/models/instances/{instance_id}/events', 'admin-readonly', 'View events'],
  ['GET', '/api/v1/models/instances/{instance_id}/logs', 'admin-readonly', 'View logs'],
  ['GET', '/api/v1/metrics', 'admin-readonly', 'View models'],
  // Health (public)
  ['GET', '/api/health', 'public', 'Health (public)'],
  ['GET', '/api/health/ready', 'public', 'Health (public)'],
  ['GET', '/api/health/live', 'public', 'Health (public)'],
  // GPU and memory (admin)
  ['GET', '/api/gpu/available', 'admin-readonly', 'View GPU'],
  ['GET', '/api/memory/usage', 'admin-readonly', 'View memory'],
  ['GET', '/api/memory/usage/multi-gpu', 'admin-readonly', 'View memory'],
  // Sleep mode (admin): not in the permissions table; sleeping and waking change a model's state as
  // loading and unloading do, so admin only; the status is a view.
  ['POST', '/api/models/instances/{instance_id}/sleep', 'admin', 'changes a model (as load/unload)'],
  ['POST', '/api/models/instances/{instance_id}/wake', 'admin', 'changes a model (as load/unload)'],
  ['GET', '/api/models/instances/{instance_id}/sleep-status', 'admin-readonly', 'View models'],
  // Direct and inference proxy (inference key). "Run inference tests (chat, benchmarks)" is yes
  // for both roles: these routes take the inference key, never a role.
  ...['GET', 'POST', 'PUT', 'PATCH', 'DELETE'].map(
    (m) =>
      [m, '/api/direct/{port}/{path}', 'inference', 'Direct proxy (inference key)'] as [
        string,
        string,
        Need,
        string,
      ],
  ),
  ['POST', '/v1/chat/completions', 'inference', 'Inference proxy (inference key)'],
  ['POST', '/v1/completions', 'inference', 'Inference proxy (inference key)'],
  // Benchmarks (admin; write operations admin only)
  ['POST', '/api/benchmarks', 'admin', 'Create or delete benchmarks: admin only'],
  ['GET', '/api/benchmarks', 'admin-readonly', 'View benchmark results'],
  ['GET', '/api/benchmarks/{id}', 'admin-readonly', 'View benchmark results'],
  ['GET', '/api/benchmarks/{id}/events', 'admin-readonly', 'View events'],
  ['DELETE', '/api/benchmarks/{id}', 'admin', 'Create or delete benchmarks: admin only'],
  // Memory profiles (admin; delete admin only)
  ['GET', '/api/memory/profiles', 'admin-readonly', 'View memory profiles'],
  ['POST', '/api/memory/profiles', 'admin-readonly', 'Memory profiles: "delete admin only"'],
  ['GET', '/api/memory/profiles/lookup', 'admin-readonly', 'View memory profiles'],
  ['POST', '/api/memory/profiles/check', 'admin-readonly', 'Memory profiles: "delete admin only"'],
  ['DELETE', '/api/memory/profiles/{id}', 'admin', 'Delete memory profiles: admin only'],
  // Configurations (admin; writes admin only)
  ['GET', '/api/configurations', 'admin-readonly', 'View configurations'],
  ['GET', '/api/configurations/{id}', 'admin-readonly', 'View configurations'],
  ['POST', '/api/configurations', 'admin', 'Save, delete, load configurations: admin only'],
  ['POST', '/api/configurations/{id}/load', 'admin', 'Save, delete, load configurations: admin only'],
  ['DELETE', '/api/configurations/{id}', 'admin', 'Save, delete, load configurations: admin only'],
  // Model move (admin): a move loads and unloads models
  ['POST', '/api/models/instances/{instance_id}/move', 'admin', 'Load or unload models: admin only'],
  ['GET', '/api/models/moves/{move_id}/events', 'admin-readonly', 'View events'],
  ['DELETE', '/api/models/moves/{move_id}', 'admin', 'Load or unload models: admin only'],
  // Auth endpoints (public); me and logout need a token of either role
  ['GET', '/api/auth/info', 'public', 'Auth endpoints (public)'],
  ['POST', '/api/auth/login', 'public', 'Auth endpoints (public)'],
  ['GET', '/api/auth/login', 'public', 'Auth endpoints (public)'],
  ['GET', '/api/auth/callback', 'public', 'Auth endpoints (public)'],
  ['GET', '/api/auth/me', 'any-role', 'current user info'],
  ['POST', '/api/auth/logout', 'any-role', 'logout'],
  // Public: /metrics
  ['GET', '/metrics', 'public', 'Route categories: /metrics is public'],
  // The dashboard page: admin "protects controller API and dashboard", and does so on the API the page
  // calls (with the JWT); the page itself holds no data, so it loads before a login.
  ['GET', '/', 'public', 'the dashboard page; its API calls carry the JWT'],
]

/** RULES: the permission table's rows for routes the spec names by action, not by path. */
const RULES: { match: (method: string, path: string) => boolean; need: Need; why: string }[] = [
  {
    match: (m, p) => p.startsWith('/api/settings') && m !== 'GET',
    need: 'admin',
    why: 'Modify settings (model-hub token): admin only',
  },
  {
    match: (m, p) => p.startsWith('/api/settings') && m === 'GET',
    need: 'admin-readonly',
    why: 'See the model-hub token: admin-readonly gets a masked placeholder',
  },
  {
    match: (m, p) => /orphan/.test(p) && m !== 'GET',
    need: 'admin',
    why: 'Kill orphan processes: admin only',
  },
  {
    // A read-only role views everything but must not obtain a credential that changes state: the
    // inference key wakes sleeping models (and its direct proxy once controlled engines).
    match: (m, p) => m === 'GET' && p === '/api/dashboard/inference-key',
    need: 'admin',
    why: 'the inference key changes state: admin only',
  },
  {
    // The table says "view everything" and the issue "orphan routes: admin only" (a foreign
    // process's command line may carry secrets): either is within the spec.
    match: (m, p) => /orphan/.test(p) && m === 'GET',
    need: 'either',
    why: 'listing orphans: view (table) or admin only (issue)',
  },
]

/**
 * Known differences between a route's declaration and the spec, each to be fixed where the route
 * is declared. The walk checks the route still differs (so a fix makes it fail until the entry goes).
 */
/** PENDING: known differences from the spec, each naming its fix (none now). */
const PENDING: Record<string, string> = {}

/** specNeed: what the spec requires of an operation of the document. */
function specNeed(method: string, path: string): { need: Need; why: string } {
  const listed = SPEC.find(([m, p]) => m === method && p === path)
  if (listed) return { need: listed[2], why: listed[3] }
  const rule = RULES.find((r) => r.match(method, path))
  if (rule) return rule
  // The route categories of the Authentication section, then the table's general rows.
  if (path.startsWith('/v1/') || path.startsWith('/api/direct/'))
    return { need: 'inference', why: 'Inference' }
  if (['/tokenize', '/detokenize', '/pooling', '/classification', '/score', '/re-rank'].includes(path))
    return { need: 'inference', why: 'Inference' }
  if (path.startsWith('/internal/')) return { need: 'internal', why: 'Internal (HMAC)' }
  if (path.startsWith('/api/health') || path.startsWith('/api/auth/') || path.startsWith('/docs'))
    return { need: 'public', why: 'Public' }
  if (method === 'GET') return { need: 'admin-readonly', why: 'admin-readonly can view everything' }
  return { need: 'admin', why: 'anything that changes state is admin only' }
}

interface Op {
  method: string
  path: string
  auth: string
  role?: Role
}

/** declaredNeed: what the operation says of itself in /docs. */
function declaredNeed(op: Op): Need {
  if (op.path === '/api/auth/me' || op.path === '/api/auth/logout') return 'any-role'
  if (op.auth === 'admin') return op.role ?? 'admin'
  return op.auth as Need
}

const SAMPLE: Record<string, string> = { port: '1', path: 'v1/models' }
const concrete = (path: string) =>
  path.replace(/\{([^}]+)\}/g, (_m, name: string) => SAMPLE[name] ?? 'roles-walk-0')

describe('the role walk over every route of /docs/json', () => {
  let gw: TestGateway
  let ops: Op[]
  const KEY = 'sk-roles-walk'

  beforeAll(async () => {
    gw = await startGateway({
      ports: [18460, 18479],
      hostEnv: {
        AUTH_MODE: 'simple',
        ADMIN_PASSWORD: 'walk-password',
        JWT_SECRET: 'r'.repeat(40),
        INFERENCE_API_KEY: KEY,
        CLUSTER_SECRET: 'c'.repeat(32),
      },
      extraYaml:
        '  benchmarks: {}\n  router: { host: 127.0.0.1, port: 0, from_gateway: true }\n' +
        // The walk sends three unsigned calls per internal route within a second or so: above the
        // default per-address limit (100 a second), which is not what it checks.
        '  cluster: { pod_id: solo, internal_rate_limit: 1000, coordination: { kind: static, static: { leader: solo, peers: [] } } }\n',
    })
    const doc = (await (await fetch(`${gw.url}/docs/json`)).json()) as {
      paths: Record<string, Record<string, Record<string, unknown>>>
    }
    ops = Object.entries(doc.paths).flatMap(([path, byMethod]) =>
      Object.entries(byMethod).map(([method, op]) => ({
        method: method.toUpperCase(),
        path,
        auth: op['x-auth'] as string,
        ...(op['x-required-role'] ? { role: op['x-required-role'] as Role } : {}),
      })),
    )
  })
  afterAll(() => gw.stop())

  /** call: one request, its status and error body; a stream is cut once its head is in. */
  async function call(op: Op, authorization?: string) {
    const init: RequestInit = {
      method: op.method,
      redirect: 'manual',
      headers: {
        ...(authorization ? { authorization } : {}),
        ...(op.method === 'GET' || op.method === 'HEAD' ? {} : { 'content-type': 'application/json' }),
      },
      ...(op.method === 'GET' || op.method === 'HEAD' ? {} : { body: '{}' }),
    }
    const res = await fetch(`${gw.url}${concrete(op.path)}`, init)
    const type = res.headers.get('content-type') ?? ''
    const body = type.includes('application/json') ? await res.json().catch(() => null) : null
    if (!type.includes('application/json')) await res.body?.cancel()
    return { status: res.status, body: body as { error?: { code?: string; message?: string } } | null }
  }

  const bearer = async (roles: Role[]) => `Bearer ${(await gw.host.auth.issueToken('walker', roles)).token}`

  it('finds every operation declared, with x-auth, and x-required-role on each admin route', () => {
    expect(ops.length).toBeGreaterThan(50)
    const bad = ops.filter(
      (op) =>
        !['public', 'admin', 'inference', 'internal'].includes(op.auth) ||
        (op.auth === 'admin' && op.role !== 'admin' && op.role !== 'admin-readonly'),
    )
    expect(bad).toEqual([])
  })

  it("declares what the spec's permission table says, route by route", () => {
    const wrong: string[] = []
    const stillPending: string[] = []
    for (const op of ops) {
      const key = `${op.method} ${op.path}`
      const { need, why } = specNeed(op.method, op.path)
      const declared = declaredNeed(op)
      const ok =
        need === declared || (need === 'either' && (declared === 'admin' || declared === 'admin-readonly'))
      if (PENDING[key]) {
        if (ok) stillPending.push(`${key}: now as the spec says; remove it from PENDING`)
        continue
      }
      if (!ok) wrong.push(`${key}: declared ${declared}, the spec says ${need} (${why})`)
    }
    expect(wrong).toEqual([])
    expect(stillPending).toEqual([])
  })

  it('finds every route the spec lists for the enabled plugins in the document', () => {
    const have = new Set(ops.map((o) => `${o.method} ${o.path}`))
    expect(SPEC.map(([m, p]) => `${m} ${p}`).filter((k) => !have.has(k))).toEqual([])
  })

  it('answers each operation with no token, admin-readonly, admin (and the key) as declared', async () => {
    const bad: string[] = []
    const expectStatus = (op: Op, who: string, got: { status: number; body: unknown }, want: string) => {
      const s = got.status
      const ok = want === '401' ? s === 401 : want === '403' ? s === 403 : s !== 401 && s !== 403 && s < 500
      if (!ok)
        bad.push(`${op.method} ${op.path} as ${who}: ${s} ${JSON.stringify(got.body)} (wanted ${want})`)
    }
    for (const op of ops) {
      const need = declaredNeed(op)
      const none = await call(op)
      const readonly = await call(op, await bearer(['admin-readonly']))
      const admin = await call(op, await bearer(['admin']))
      switch (need) {
        case 'public':
          expectStatus(op, 'no token', none, 'pass')
          expectStatus(op, 'admin-readonly', readonly, 'pass')
          expectStatus(op, 'admin', admin, 'pass')
          break
        case 'any-role':
          expectStatus(op, 'no token', none, '401')
          expectStatus(op, 'admin-readonly', readonly, 'pass')
          expectStatus(op, 'admin', admin, 'pass')
          break
        case 'admin-readonly':
          expectStatus(op, 'no token', none, '401')
          expectStatus(op, 'admin-readonly', readonly, 'pass')
          expectStatus(op, 'admin', admin, 'pass')
          break
        case 'admin':
          expectStatus(op, 'no token', none, '401')
          expectStatus(op, 'admin-readonly', readonly, '403')
          expectStatus(op, 'admin', admin, 'pass')
          if (readonly.status === 403 && !readonly.body?.error?.message?.includes("'admin' role"))
            bad.push(
              `${op.method} ${op.path}: the 403 does not name the role: ${JSON.stringify(readonly.body)}`,
            )
          break
        case 'inference': {
          // The inference key, never the admin JWT (the spec keeps the two mechanisms apart).
          expectStatus(op, 'no key', none, '401')
          expectStatus(op, 'admin-readonly JWT', readonly, '401')
          expectStatus(op, 'admin JWT', admin, '401')
          expectStatus(op, 'the key', await call(op, `Bearer ${KEY}`), 'pass')
          break
        }
        case 'internal':
          // Unsigned: refused by the cluster signature check (401), never by a role; the admin JWT
          // does not stand in for the signature.
          expectStatus(op, 'no token', none, '401')
          expectStatus(op, 'admin', admin, '401')
          break
        default:
          bad.push(`${op.method} ${op.path}: unknown declaration ${need}`)
      }
      if (none.status === 401 && need !== 'inference' && none.body?.error?.code !== 'UNAUTHORIZED')
        bad.push(`${op.method} ${op.path}: 401 not in the controller shape: ${JSON.stringify(none.body)}`)
    }
    expect(bad).toEqual([])
  })
})
