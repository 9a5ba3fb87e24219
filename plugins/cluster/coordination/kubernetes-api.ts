import { existsSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import type { ClusterConfig } from '../config.ts'
import type { Peer } from './types.ts'

/**
 * KubernetesApi: the few calls of the Kubernetes REST API the Lease coordinator makes (a Lease's
 * get, create and update; the pods list; one Endpoints object), over the runtime's own `fetch`, so
 * it works inside the compiled binary with no client library. Every call has a deadline and the
 * coordinator's stop signal; a non-2xx answer becomes a KubernetesApiError carrying the API
 * server's `Status` (reason, message).
 */
type KubernetesConfig = ClusterConfig['coordination']['kubernetes']
export type Env = Record<string, string | undefined>

export interface LeaseSpec {
  holderIdentity?: string
  leaseDurationSeconds?: number
  acquireTime?: string
  renewTime?: string
  leaseTransitions?: number
}

export interface Lease {
  apiVersion: 'coordination.k8s.io/v1'
  kind: 'Lease'
  metadata: { name: string; namespace?: string; resourceVersion?: string; [k: string]: unknown }
  spec: LeaseSpec
}

export interface PodList {
  items: {
    metadata: { name: string; deletionTimestamp?: string }
    status?: { phase?: string; podIP?: string; conditions?: { type: string; status: string }[] }
  }[]
}

export interface Endpoints {
  subsets?: {
    addresses?: { ip: string; hostname?: string; targetRef?: { kind?: string; name?: string } }[]
  }[]
}

/** KubernetesApiError: `status` 0 when the API server was not reached (refused, timed out). */
export class KubernetesApiError extends Error {
  constructor(
    readonly status: number,
    readonly reason: string,
    message: string,
  ) {
    super(message)
    this.name = 'KubernetesApiError'
  }
}

/** Connection: where the API server is and how this pod authenticates to it. */
export interface Connection {
  baseUrl: string
  namespace: string
  /** token is read again on every call: bound service-account tokens are rotated in their file. */
  token: () => Promise<string>
  ca?: string
}

/**
 * resolveConnection: in a pod, the API server of KUBERNETES_SERVICE_HOST/PORT, the mounted
 * service-account token, CA and namespace files; outside, `api_url` (or K8S_API_URL) with K8S_TOKEN
 * or the token file. Throws a readable error naming what is missing.
 */
export function resolveConnection(cfg: KubernetesConfig, env: Env): Connection {
  const baseUrl = (cfg.api_url ?? env.K8S_API_URL ?? inClusterUrl(env)).replace(/\/+$/, '')
  const nsFile = join(dirname(cfg.token_file), 'namespace')
  const namespace = cfg.namespace ?? (existsSync(nsFile) ? readFileSync(nsFile, 'utf8').trim() : '')
  if (!namespace)
    throw new Error(
      `kubernetes coordination: no namespace (set coordination.kubernetes.namespace; ${nsFile} is not there)`,
    )
  const fixed = env.K8S_TOKEN
  const token = async () => {
    if (fixed) return fixed
    try {
      return (await Bun.file(cfg.token_file).text()).trim()
    } catch {
      throw new KubernetesApiError(
        0,
        'NoToken',
        `cannot read the service-account token ${cfg.token_file} (outside a pod, set K8S_TOKEN)`,
      )
    }
  }
  const ca =
    baseUrl.startsWith('https:') && existsSync(cfg.ca_file) ? readFileSync(cfg.ca_file, 'utf8') : undefined
  return ca === undefined ? { baseUrl, namespace, token } : { baseUrl, namespace, token, ca }
}

function inClusterUrl(env: Env): string {
  const host = env.KUBERNETES_SERVICE_HOST
  if (!host)
    throw new Error(
      'kubernetes coordination: not in a pod (no KUBERNETES_SERVICE_HOST); set coordination.kubernetes.api_url or K8S_API_URL',
    )
  return `https://${host.includes(':') ? `[${host}]` : host}:${env.KUBERNETES_SERVICE_PORT ?? '443'}`
}

/** microTime: a Lease's MicroTime, RFC 3339 with exactly six fractional digits, as metav1 writes it. */
export function microTime(ms: number): string {
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z')
}

/** podPeers: the pods that serve: Running, Ready, not being deleted, with an IP. */
export function podPeers(list: PodList, port: number): Peer[] {
  return list.items
    .filter(
      (p) =>
        p.status?.phase === 'Running' &&
        !p.metadata.deletionTimestamp &&
        p.status.podIP &&
        p.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'),
    )
    .map((p) => ({ podId: p.metadata.name, address: `http://${hostPort(p.status!.podIP!, port)}` }))
}

/** endpointPeers: the ready addresses of a headless Service (`notReadyAddresses` are left out). */
export function endpointPeers(ep: Endpoints, port: number): Peer[] {
  return (ep.subsets ?? []).flatMap((s) =>
    (s.addresses ?? []).map((a) => ({
      podId: a.targetRef?.kind === 'Pod' && a.targetRef.name ? a.targetRef.name : (a.hostname ?? a.ip),
      address: `http://${hostPort(a.ip, port)}`,
    })),
  )
}

function hostPort(ip: string, port: number): string {
  return ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`
}

export class KubernetesApi {
  constructor(
    private readonly conn: Connection,
    private readonly timeoutMs: number,
    private readonly stopSignal: AbortSignal,
  ) {}

  private leasePath(name: string): string {
    return `/apis/coordination.k8s.io/v1/namespaces/${this.conn.namespace}/leases/${encodeURIComponent(name)}`
  }

  /** getLease: the Lease, or null when it does not exist yet. */
  async getLease(name: string): Promise<Lease | null> {
    try {
      return await this.call<Lease>('GET', this.leasePath(name), 'get lease')
    } catch (err) {
      if (err instanceof KubernetesApiError && err.status === 404) return null
      throw err
    }
  }

  createLease(lease: Lease): Promise<Lease> {
    const path = `/apis/coordination.k8s.io/v1/namespaces/${this.conn.namespace}/leases`
    return this.call<Lease>('POST', path, 'create lease', lease)
  }

  /** updateLease: a PUT carrying metadata.resourceVersion, so a concurrent writer makes it 409. */
  updateLease(lease: Lease): Promise<Lease> {
    return this.call<Lease>('PUT', this.leasePath(lease.metadata.name), 'update lease', lease)
  }

  listPods(labelSelector: string): Promise<PodList> {
    const q = new URLSearchParams({ labelSelector })
    return this.call<PodList>('GET', `/api/v1/namespaces/${this.conn.namespace}/pods?${q}`, 'list pods')
  }

  /** getEndpoints: a Service's Endpoints; none yet (404, the controller has not written them) is empty. */
  async getEndpoints(name: string): Promise<Endpoints> {
    const path = `/api/v1/namespaces/${this.conn.namespace}/endpoints/${encodeURIComponent(name)}`
    try {
      return await this.call<Endpoints>('GET', path, 'get endpoints')
    } catch (err) {
      if (err instanceof KubernetesApiError && err.status === 404) return {}
      throw err
    }
  }

  private async call<T>(method: string, path: string, what: string, body?: unknown): Promise<T> {
    const url = this.conn.baseUrl + path
    const headers: Record<string, string> = {
      authorization: `Bearer ${await this.conn.token()}`,
      accept: 'application/json',
    }
    if (body !== undefined) headers['content-type'] = 'application/json'
    const signal = AbortSignal.any([this.stopSignal, AbortSignal.timeout(this.timeoutMs)])
    let res: Response
    try {
      res = await fetch(url, {
        method,
        headers,
        signal,
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        ...(this.conn.ca === undefined ? {} : { tls: { ca: this.conn.ca } }),
      })
    } catch (err) {
      const why = this.stopSignal.aborted
        ? 'stopped'
        : signal.aborted
          ? `no answer within ${this.timeoutMs} ms`
          : (err as Error).message
      throw new KubernetesApiError(
        0,
        'Unreachable',
        `${what}: Kubernetes API ${this.conn.baseUrl} unreachable (${why})`,
      )
    }
    const text = await res.text().catch(() => '')
    if (res.ok) return JSON.parse(text) as T
    let status: { reason?: string; message?: string } = {}
    try {
      status = JSON.parse(text)
    } catch {}
    const reason = status.reason ?? res.statusText
    const hint =
      res.status === 401
        ? ' (the token was refused: check the service account or K8S_TOKEN)'
        : res.status === 403
          ? ' (the Role bound to the service account does not allow it)'
          : ''
    throw new KubernetesApiError(
      res.status,
      reason,
      `${what}: Kubernetes API answered ${res.status} ${reason}: ${status.message ?? text.slice(0, 200)}${hint}`,
    )
  }
}
