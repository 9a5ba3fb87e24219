import type { Server } from 'bun'
import type { Endpoints, Lease } from '../../plugins/cluster/coordination/kubernetes-api.ts'

/**
 * LeaseStandIn is a STAND-IN for the Kubernetes API server, not Kubernetes: a Bun.serve on loopback
 * that answers only the calls modelgate's Lease coordinator makes, the way the API server answers
 * them, so the coordinator is tested over a real socket without a cluster:
 * - Leases (`/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]`): GET, POST, PUT. Every
 *   write takes the next resourceVersion of one counter (as etcd's revision); a PUT whose
 *   metadata.resourceVersion is not the stored one is 409 `Conflict`, a PUT without one 422
 *   `Invalid` (leases allow no unconditional update), a POST of an existing name 409
 *   `AlreadyExists`, a missing name 404 `NotFound`, MicroTimes without exactly six fractional digits
 *   400: each a `Status` object as the API server writes it.
 * - pods (`/api/v1/namespaces/{ns}/pods?labelSelector=`, equality selectors) and one Endpoints GET.
 * - a bearer token (401 `Unauthorized` otherwise) and, when `rules` is set, RBAC over those rules
 *   (403 `Forbidden`), so a Role can be checked against what the coordinator really calls.
 * - `mode`: 'refuse' answers 503 to everything, 'hang' answers nothing (a partitioned API server).
 */
export interface StandInPod {
  name: string
  ip?: string
  ready?: boolean
  phase?: string
  labels?: Record<string, string>
  deleting?: boolean
}

export interface RbacRule {
  apiGroups: string[]
  resources: string[]
  verbs: string[]
  resourceNames?: string[]
}

/** StandInCall: one request as RBAC sees it (verb, API group, resource, name). */
export interface StandInCall {
  verb: string
  group: string
  resource: string
  name?: string
  status: number
}

const LEASES = /^\/apis\/coordination\.k8s\.io\/v1\/namespaces\/([^/]+)\/leases(?:\/([^/]+))?$/
const PODS = /^\/api\/v1\/namespaces\/([^/]+)\/pods$/
const ENDPOINTS = /^\/api\/v1\/namespaces\/([^/]+)\/endpoints\/([^/]+)$/
const MICRO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$/

export class LeaseStandIn {
  mode: 'serve' | 'refuse' | 'hang' = 'serve'
  rules: RbacRule[] | undefined
  readonly calls: StandInCall[] = []
  conflicts = 0
  pods: StandInPod[] = []
  private readonly server: Server<undefined>
  private readonly leases = new Map<string, Lease>()
  private readonly endpoints = new Map<string, Endpoints>()
  private revision = 0
  private readonly hung = new Set<() => void>()
  private gate: { count: number; waiting: (() => void)[] } | undefined

  /** tls: serve HTTPS with this certificate, as the in-cluster API server does. */
  constructor(
    public token: string,
    private readonly tls?: { cert: string; key: string },
  ) {
    this.server = Bun.serve({
      hostname: '127.0.0.1',
      port: 0,
      fetch: (req) => this.handle(req),
      ...(tls ? { tls } : {}),
    })
  }

  get port(): number {
    return this.server.port!
  }

  get url(): string {
    return `${this.tls ? 'https' : 'http'}://127.0.0.1:${this.server.port}`
  }

  /** lease: the stored Lease (a copy), as `kubectl get lease -o json` would show it. */
  lease(name: string, ns = 'default'): Lease | undefined {
    const l = this.leases.get(`${ns}/${name}`)
    return l && structuredClone(l)
  }

  /** seedLease writes a Lease directly (another holder, outside the pods under test). */
  seedLease(name: string, spec: Lease['spec'], ns = 'default'): Lease {
    return this.store(ns, name, {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { name },
      spec,
    })
  }

  setEndpoints(name: string, addresses: { ip: string; pod: string }[], ns = 'default'): void {
    const subsets = [
      { addresses: addresses.map((a) => ({ ip: a.ip, targetRef: { kind: 'Pod', name: a.pod } })) },
    ]
    this.endpoints.set(`${ns}/${name}`, { subsets })
  }

  /** holdWrites: the next `count` lease writes wait until all have arrived, then run in arrival order. */
  holdWrites(count: number): void {
    this.gate = { count, waiting: [] }
  }

  /** setMode: 'serve' again also answers the hung requests (with 503, as a restarted server would). */
  setMode(mode: LeaseStandIn['mode']): void {
    this.mode = mode
    if (mode !== 'hang') this.releaseHung()
  }

  async stop(): Promise<void> {
    this.releaseHung()
    await this.server.stop(true)
  }

  private releaseHung(): void {
    for (const answer of this.hung) answer()
    this.hung.clear()
  }

  private async handle(req: Request): Promise<Response> {
    if (this.mode === 'refuse')
      return status(503, 'ServiceUnavailable', 'the server is currently unable to handle the request')
    if (this.mode === 'hang') {
      const { promise, resolve } = Promise.withResolvers<void>()
      this.hung.add(resolve)
      await promise
      return status(503, 'ServiceUnavailable', 'the server is currently unable to handle the request')
    }
    const url = new URL(req.url)
    const call = route(req.method, url.pathname)
    if (!call) return status(404, 'NotFound', 'the server could not find the requested resource')
    const res = await this.serve(req, url, call)
    this.calls.push({ ...call, status: res.status })
    return res
  }

  private async serve(req: Request, url: URL, call: Route): Promise<Response> {
    if (req.headers.get('authorization') !== `Bearer ${this.token}`)
      return status(401, 'Unauthorized', 'Unauthorized')
    const what = `${call.resource}${call.group ? `.${call.group}` : ''}`
    if (this.rules && !allowed(this.rules, call))
      return status(
        403,
        'Forbidden',
        `${what} "${call.name ?? ''}" is forbidden: User "system:serviceaccount:${call.ns}:modelgate" cannot ${call.verb} resource "${call.resource}" in API group "${call.group}" in the namespace "${call.ns}"`,
      )
    if (call.resource === 'pods')
      return Response.json(this.podList(url.searchParams.get('labelSelector') ?? ''))
    const key = `${call.ns}/${call.name}`
    if (call.resource === 'endpoints') {
      const ep = this.endpoints.get(key)
      return ep
        ? Response.json({ kind: 'Endpoints', apiVersion: 'v1', ...ep })
        : status(404, 'NotFound', `endpoints "${call.name}" not found`)
    }
    if (call.verb === 'get') {
      const lease = this.leases.get(key)
      return lease ? Response.json(lease) : status(404, 'NotFound', `${what} "${call.name}" not found`)
    }
    const body = (await req.json().catch(() => null)) as Lease | null
    const bad =
      body === null ? ([400, 'BadRequest', 'the body is not a Lease'] as const) : invalid(body, call)
    if (bad) return status(...bad)
    const name = body!.metadata.name
    if (this.gate) await this.passGate()
    const existing = this.leases.get(`${call.ns}/${name}`)
    if (call.verb === 'create') {
      if (existing) return status(409, 'AlreadyExists', `${what} "${name}" already exists`)
      return Response.json(this.store(call.ns, name, body!), { status: 201 })
    }
    const rv = body!.metadata.resourceVersion
    if (!existing) return Response.json(this.store(call.ns, name, body!), { status: 201 })
    if (!rv)
      return status(
        422,
        'Invalid',
        `${what} "${name}" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update`,
      )
    if (rv !== existing.metadata.resourceVersion) {
      this.conflicts++
      return status(
        409,
        'Conflict',
        `Operation cannot be fulfilled on ${what} "${name}": the object has been modified; please apply your changes to the latest version and try again`,
      )
    }
    return Response.json(this.store(call.ns, name, body!, existing))
  }

  private async passGate(): Promise<void> {
    const gate = this.gate!
    const { promise, resolve } = Promise.withResolvers<void>()
    gate.waiting.push(resolve)
    if (gate.waiting.length >= gate.count) {
      this.gate = undefined
      for (const go of gate.waiting) go()
    }
    await promise
  }

  private store(ns: string, name: string, body: Lease, existing?: Lease): Lease {
    const metadata = {
      name,
      namespace: ns,
      uid: existing?.metadata.uid ?? crypto.randomUUID(),
      resourceVersion: String(++this.revision),
      creationTimestamp:
        existing?.metadata.creationTimestamp ?? new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
    }
    const lease: Lease = {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata,
      spec: { ...body.spec },
    }
    this.leases.set(`${ns}/${name}`, lease)
    return structuredClone(lease)
  }

  private podList(selector: string) {
    const terms = selector
      .split(',')
      .filter(Boolean)
      .map((t) => /^([^!=]+)(==|=|!=)(.*)$/.exec(t.trim()))
    const items = this.pods
      .filter((p) =>
        terms.every((m) => m && (m[2] === '!=' ? p.labels?.[m[1]!] !== m[3] : p.labels?.[m[1]!] === m[3])),
      )
      .map((p) => ({
        metadata: {
          name: p.name,
          labels: p.labels ?? {},
          ...(p.deleting ? { deletionTimestamp: new Date().toISOString() } : {}),
        },
        status: {
          phase: p.phase ?? 'Running',
          ...(p.ip ? { podIP: p.ip } : {}),
          conditions: [{ type: 'Ready', status: p.ready === false ? 'False' : 'True' }],
        },
      }))
    return { kind: 'PodList', apiVersion: 'v1', metadata: { resourceVersion: String(this.revision) }, items }
  }
}

type Route = Omit<StandInCall, 'status'> & { ns: string }

function route(method: string, path: string): Route | undefined {
  let m = LEASES.exec(path)
  if (m) {
    const base = { group: 'coordination.k8s.io', resource: 'leases', ns: m[1]! }
    if (!m[2]) return method === 'POST' ? { ...base, verb: 'create' } : undefined
    const verb = method === 'GET' ? 'get' : method === 'PUT' ? 'update' : undefined
    return verb ? { ...base, verb, name: decodeURIComponent(m[2]) } : undefined
  }
  m = PODS.exec(path)
  if (m && method === 'GET') return { verb: 'list', group: '', resource: 'pods', ns: m[1]! }
  m = ENDPOINTS.exec(path)
  if (m && method === 'GET') return { verb: 'get', group: '', resource: 'endpoints', ns: m[1]!, name: m[2]! }
  return undefined
}

/** allowed: RBAC's rule match; a rule naming resourceNames never allows create or list. */
function allowed(rules: RbacRule[], call: Route): boolean {
  const has = (list: string[], v: string) => list.includes('*') || list.includes(v)
  return rules.some(
    (r) =>
      has(r.apiGroups, call.group) &&
      has(r.resources, call.resource) &&
      has(r.verbs, call.verb) &&
      (!r.resourceNames?.length || (call.name !== undefined && r.resourceNames.includes(call.name))),
  )
}

/** invalid: the API server's decoding (400 BadRequest) and validation (422 Invalid) of a Lease. */
function invalid(body: Lease, call: Route): readonly [number, string, string] | undefined {
  const name = body.metadata?.name
  if (!name) return [422, 'Invalid', 'metadata.name: Required value']
  if (call.name !== undefined && name !== call.name)
    return [
      400,
      'BadRequest',
      `the name of the object (${name}) does not match the name on the URL (${call.name})`,
    ]
  if (body.metadata.namespace !== undefined && body.metadata.namespace !== call.ns)
    return [
      400,
      'BadRequest',
      'the namespace of the provided object does not match the namespace sent on the request',
    ]
  const spec = body.spec ?? {}
  for (const k of ['acquireTime', 'renewTime'] as const) {
    const t = spec[k]
    if (t !== undefined && !MICRO_TIME.test(t))
      return [
        400,
        'BadRequest',
        `spec.${k}: parsing time "${t}" as "2006-01-02T15:04:05.000000Z07:00" failed`,
      ]
  }
  if (
    spec.leaseDurationSeconds !== undefined &&
    !(Number.isInteger(spec.leaseDurationSeconds) && spec.leaseDurationSeconds > 0)
  )
    return [422, 'Invalid', 'spec.leaseDurationSeconds: Invalid value: must be greater than 0']
  if (
    spec.leaseTransitions !== undefined &&
    !(Number.isInteger(spec.leaseTransitions) && spec.leaseTransitions >= 0)
  )
    return [422, 'Invalid', 'spec.leaseTransitions: Invalid value: must be greater than or equal to 0']
  return undefined
}

function status(code: number, reason: string, message: string): Response {
  const body = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code }
  return Response.json(body, { status: code })
}
