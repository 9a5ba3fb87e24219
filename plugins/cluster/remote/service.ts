import { AppError, notFound } from '../../../src/http/errors.ts'
import type {
  GatewayPodApi,
  InstanceEventsQuery,
  LoadRequest,
  LoadResponse,
  LogRecord,
  PodRecords,
  SleepLevel,
  SleepResult,
  UnloadResult,
  WakeRequest,
  WakeResult,
} from '../../gateway/api.ts'
import type { PeerCalls } from '../peer-client.ts'
import { gpuInfo, modelsFull } from './pod-views.ts'
import { relaySse } from './relay.ts'
import type { ClusterLoad, GpuInfo, ModelsFull } from './schemas.ts'

/** PodDirectory: which pod holds an instance and where a pod is (the cluster's ClusterService). */
export interface PodDirectory {
  readonly podId: string
  ownerOf(instanceId: string): { podId: string; address: string; local: boolean } | null
  peerAddress(podId: string): string | undefined
}

export interface RemoteDeps {
  cluster: PodDirectory
  /** gateway: this pod's own, whose records (GatewayPodApi.records) a pod answers with. */
  gateway: GatewayPodApi
  /** How RemoteLifecycle reaches a peer's signed /internal API (PeerClient). */
  peers: PeerCalls
  /** Deadline of a call that does not wait on an engine (plugins.cluster.request_timeout_ms). */
  timeoutMs: number
}

/** Pod: where an operation runs; `address` is absent for this pod. */
interface Pod {
  podId: string
  address: string | null
}

type WithPod<T> = T & { podId: string }

/** PeerAsk: how another pod is asked for a record: its internal route, body and deadline. */
interface PeerAsk {
  method: 'GET' | 'POST'
  path: string
  body?: unknown
  timeoutMs?: number
}

/**
 * A sleep waits for the instance's in-flight requests (up to its drain deadline: the body's, else
 * the owning pod's default of 60 s), then for the engine and nvidia-smi; a wake may reload weights.
 * Their peer calls get these deadlines, not the short one of a plain call.
 */
const SLEEP_DRAIN_DEFAULT_MS = 60_000
const ENGINE_WORK_MS = 120_000
/**
 * A load answers once its engine is spawned, after the target has read its GPUs (nvidia-smi, whose
 * own deadline is 5 s) and run its pre-load check: longer than a plain call's deadline on a busy host.
 */
const LOAD_ANSWER_MS = 30_000
/** How many loads this pod sent to peers it remembers, until the owner's heartbeat lists them. */
const PLACED_LIMIT = 1024

/**
 * RemoteLifecycle: the cluster API's lifecycle calls, run on the pod that holds the instance (or
 * the pod asked for). This pod's own instances go to its gateway directly; another pod's go over one
 * signed hop to its /internal routes, which act on their own gateway only (never a second hop). A
 * peer's refusal comes back with its own status and code; a peer that cannot be reached is 502
 * PEER_UNREACHABLE, one past its deadline 504 PEER_TIMEOUT, both naming the pod.
 *
 * Where an instance is: this pod's view of the cluster (ownerOf: its gateway, else the pods'
 * reported states), then the pods this pod itself loaded on (a load on a peer is known here at once,
 * before the peer's next heartbeat lists it). A pod that answers 404 passes the question to the next.
 */
export class RemoteLifecycle {
  private readonly placed = new Map<string, string>()

  constructor(private readonly deps: RemoteDeps) {}

  get podId(): string {
    return this.deps.cluster.podId
  }

  /** load: a cluster load on `targetPodId` (default this pod), as the gateway's load body. */
  async load(body: ClusterLoad): Promise<WithPod<LoadResponse>> {
    const pod = this.pod(body.targetPodId ?? this.podId)
    const req = gatewayLoad(body)
    const res = await this.relay(
      pod,
      { method: 'POST', path: '/internal/models/load', body: req, timeoutMs: LOAD_ANSWER_MS },
      (r) => r.load(req),
    )
    if (pod.address) this.remember(res.instance_id, pod.podId)
    return { ...res, podId: pod.podId }
  }

  unload(id: string): Promise<WithPod<UnloadResult>> {
    const path = `/internal/models/${enc(id)}/unload`
    return this.onOwner(id, (pod) => this.relay(pod, { method: 'POST', path }, (r) => r.unload(id)))
  }

  sleep(id: string, level: SleepLevel, drainTimeoutMs?: number): Promise<WithPod<SleepResult>> {
    const query = drainTimeoutMs === undefined ? { level } : { level, drain_timeout_ms: drainTimeoutMs }
    const drain = drainTimeoutMs === undefined ? '' : `&drain_timeout_ms=${drainTimeoutMs}`
    const path = `/internal/models/${enc(id)}/sleep?level=${level}${drain}`
    const timeoutMs = (drainTimeoutMs ?? SLEEP_DRAIN_DEFAULT_MS) + ENGINE_WORK_MS
    return this.onOwner(id, (pod) =>
      this.relay(pod, { method: 'POST', path, timeoutMs }, (r) => r.sleep(id, query)),
    )
  }

  wake(id: string, tags: WakeRequest['tags']): Promise<WithPod<WakeResult>> {
    const body = tags === undefined ? {} : { tags }
    const path = `/internal/models/${enc(id)}/wake`
    return this.onOwner(id, (pod) =>
      this.relay(pod, { method: 'POST', path, body, timeoutMs: ENGINE_WORK_MS }, (r) => r.wake(id, body)),
    )
  }

  logs(id: string, lines = 100): Promise<WithPod<LogRecord>> {
    const path = `/internal/models/${enc(id)}/logs?lines=${lines}`
    return this.onOwner(id, (pod) => this.relay(pod, { method: 'GET', path }, (r) => r.logs(id, { lines })))
  }

  /**
   * events: the instance's event stream from the pod that holds it, the `hint` pod first. A peer's
   * stream is relayed byte for byte and ends when either side ends (the client leaving aborts the
   * peer's fetch).
   */
  async events(
    id: string,
    filter: InstanceEventsQuery,
    hint: string | undefined,
    signal: AbortSignal,
  ): Promise<Response> {
    const query = new URLSearchParams()
    if (filter.types !== undefined) query.set('types', filter.types)
    if (filter.replay_logs !== undefined) query.set('replay_logs', filter.replay_logs)
    const qs = query.size ? `?${query}` : ''
    return this.tryOwners(id, hint, async (pod) => {
      if (!pod.address) return this.deps.gateway.records.events(id, filter, signal)
      const cancel = new AbortController()
      const stop = () => cancel.abort()
      signal.addEventListener('abort', stop, { once: true })
      try {
        const res = await this.deps.peers.stream(
          { podId: pod.podId, address: pod.address },
          `/internal/models/${enc(id)}/events${qs}`,
          cancel.signal,
        )
        return relaySse(res, cancel, () => signal.removeEventListener('abort', stop))
      } catch (err) {
        cancel.abort()
        signal.removeEventListener('abort', stop)
        throw peerFailure(pod, err)
      }
    })
  }

  /** The per-pod views: this pod answers itself, another pod over one hop. */
  gpuAvailable(podId: string) {
    return this.view(podId, '/internal/gpu/available', (r) => r.gpuAvailable())
  }

  memory(podId: string) {
    return this.view(podId, '/internal/memory/multi-gpu', (r) => r.multiGpu())
  }

  gpuInfo(podId: string) {
    return this.view<GpuInfo>(podId, '/internal/gpu/info', () => gpuInfo(this.deps.gateway))
  }

  modelsFull(podId: string) {
    return this.view<ModelsFull>(podId, '/internal/models', () => modelsFull(this.deps.gateway))
  }

  private async view<T>(
    podId: string,
    path: string,
    here: (r: PodRecords) => T | Promise<T>,
  ): Promise<WithPod<T>> {
    const pod = this.pod(podId)
    const res = await this.relay(pod, { method: 'GET', path }, here)
    return { ...res, podId: pod.podId }
  }

  /**
   * relay: one record of a pod's gateway: this pod's own (`here`, from its records), or another
   * pod's over one signed hop to the internal route that answers it with that pod's records.
   */
  private relay<T>(pod: Pod, peer: PeerAsk, here: (r: PodRecords) => T | Promise<T>): Promise<T> {
    if (!pod.address) return Promise.resolve(here(this.deps.gateway.records))
    return this.call<T>(pod, peer.method, peer.path, peer.body, peer.timeoutMs)
  }

  /** pod: a known pod (404 POD_NOT_FOUND otherwise); this pod has no address (no hop). */
  private pod(podId: string): Pod {
    if (podId === this.podId) return { podId, address: null }
    const address = this.deps.cluster.peerAddress(podId)
    if (!address) throw notFound(`No pod '${podId}' in the cluster`, 'POD_NOT_FOUND')
    return { podId, address }
  }

  private async onOwner<T extends object>(id: string, act: (pod: Pod) => Promise<T>): Promise<WithPod<T>> {
    return this.tryOwners(id, undefined, async (pod) => ({ ...(await act(pod)), podId: pod.podId }))
  }

  /**
   * tryOwners runs `act` on the pods that may hold the instance, in order, until one does not answer
   * 404; none → 404 INSTANCE_NOT_FOUND.
   */
  private async tryOwners<T>(
    id: string,
    hint: string | undefined,
    act: (pod: Pod) => Promise<T>,
  ): Promise<T> {
    const owner = this.deps.cluster.ownerOf(id)
    const order = [hint, owner?.podId, this.placed.get(id)].filter(
      (p, i, all): p is string => p !== undefined && all.indexOf(p) === i,
    )
    let last: AppError | null = null
    for (const podId of order) {
      const address = podId === this.podId ? null : this.deps.cluster.peerAddress(podId)
      if (address === undefined) continue
      try {
        return await act({ podId, address })
      } catch (err) {
        if (!(err instanceof AppError) || err.status !== 404) throw err
        if (this.placed.get(id) === podId) this.placed.delete(id)
        last = err
      }
    }
    throw notFound(`No pod holds instance '${id}'${last ? ` (${last.message})` : ''}`, 'INSTANCE_NOT_FOUND')
  }

  private async call<T>(
    pod: Pod,
    method: string,
    path: string,
    body?: unknown,
    timeoutMs?: number,
  ): Promise<T> {
    try {
      const to = { podId: pod.podId, address: pod.address as string }
      return await this.deps.peers.request<T>(to, method, path, body, {
        timeoutMs: timeoutMs ?? this.deps.timeoutMs,
      })
    } catch (err) {
      throw peerFailure(pod, err)
    }
  }

  private remember(instanceId: string, podId: string): void {
    this.placed.set(instanceId, podId)
    if (this.placed.size > PLACED_LIMIT) this.placed.delete(this.placed.keys().next().value as string)
  }
}

/**
 * peerFailure names the pod in what the peer client threw: no connection → 502 PEER_UNREACHABLE,
 * past the deadline → 504 PEER_TIMEOUT, a refused signature (401/403 from the peer's front) → 502
 * PEER_REFUSED (the admin's own token is not at fault). The peer's own answers pass as they are.
 */
export function peerFailure(pod: Pod, err: unknown): unknown {
  if (!(err instanceof AppError)) return err
  const who = `Pod '${pod.podId}' (${pod.address})`
  if (err.code === 'PEER_UNAVAILABLE')
    return new AppError(502, 'PEER_UNREACHABLE', `${who} cannot be reached: ${err.message}`)
  if (err.code === 'PEER_TIMEOUT')
    return new AppError(504, 'PEER_TIMEOUT', `${who} did not answer in time: ${err.message}`)
  if (err.status === 401 || err.status === 403)
    return new AppError(
      502,
      'PEER_REFUSED',
      `${who} refused this pod's signed call (${err.code}: ${err.message}); do both share CLUSTER_SECRET?`,
    )
  return err
}

/** gatewayLoad maps the cluster load body (camelCase) onto the gateway's (snake_case). */
function gatewayLoad(b: ClusterLoad): LoadRequest {
  const req: LoadRequest = { model_path: b.modelPath }
  if (b.servedModelName !== undefined) req.served_model_name = b.servedModelName
  if (b.maxTokens !== undefined) req.max_tokens = b.maxTokens
  if (b.gpuIds !== undefined) req.gpu_ids = b.gpuIds
  if (b.tensorParallelSize !== undefined) req.tensor_parallel_size = b.tensorParallelSize
  if (b.enableSleepMode !== undefined) req.enable_sleep_mode = b.enableSleepMode
  if (b.extraArgs !== undefined) req.extra_args = b.extraArgs
  if (b.gpuMemoryUtilization !== undefined) req.gpu_memory_utilization = b.gpuMemoryUtilization
  if (b.force !== undefined) req.force = b.force
  if (b.engineKind !== undefined) req.engine_kind = b.engineKind
  return req
}

const enc = encodeURIComponent
