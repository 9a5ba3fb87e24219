import { randomBytes } from 'node:crypto'
import { Elysia } from 'elysia'
import { Counter, type Registry } from 'prom-client'
import type { Backend, BackendRequest, LeaseHandle, Readiness } from '../../src/directory/backend.ts'
import type { BackendSource, ModelDirectory } from '../../src/directory/directory.ts'
import { callSpan, endCall, traced } from '../../src/directory/trace.ts'
import type { Logger } from '../../src/host/logger.ts'
import { METRIC_PREFIX } from '../../src/host/metrics.ts'
import type { RawRoute } from '../../src/host/plugin.ts'
import type { TraceSpan } from '../../src/host/telemetry/spans.ts'
import { ProxyError } from '../../src/http/schemas.ts'
import { servedByTheFront } from '../../src/wire/openai-routes.ts'
import { upstreams } from '../../src/wire/pool.ts'
import type { ForwardEnd, WireAction, WireForwardAction, WireRequest } from '../../src/wire/route.ts'
import { errorCode, upstreamConnectTimeout, upstreamUnavailable } from '../../src/wire/upstream-errors.ts'
import type { GatewayInferenceApi, RemoteModel } from '../gateway/api.ts'
import { hopCandidates } from './routing-table.ts'
import type { Pod, RoutingEntry, RoutingTable } from './schemas.ts'
import { CLUSTER_HEADERS, DESTINATION_PARAM, signRequest } from './signing.ts'

/**
 * The inference hop: every pod's `/v1` serves every model of the routing table. A model no local
 * instance can take goes, in one hop, to the gateway of a pod that serves it (never to its engine,
 * which listens on 127.0.0.1 without auth), as `POST <podAddress>/internal/v1<gateway path>`,
 * e.g. `/internal/v1/v1/chat/completions`: signed like every internal call (signing.ts) and
 * verified by that pod's front before anything answers it, so the hop cannot be used from outside,
 * while the inference key stays the edge's (its front checked it). The body goes unchanged (the
 * model field as the client sent it); the response, streamed or not, is relayed by the edge's
 * WireExchange through the one upstream pool. The receiving pod plans it on its own instances only
 * (GatewayInferenceApi.planLocal), so a request never hops twice: a model it no longer has is 400
 * `invalid_model` in the proxy shape.
 *
 * The signed target starts with a nonce (`?hop=<process>.<n>`) because the signature covers method,
 * target, timestamp and body only: two identical chats sent in the same millisecond would otherwise
 * carry one signature, and the receiver refuses the second as a replay. The destination pod follows
 * (`&to=<pod id>`, signing.ts: a hop captured on its way to one pod is refused by the others), then
 * the client's own query; the receiver removes the first two before the engine sees the query.
 *
 * The other pods that hold a model are backends of the model directory (src/directory), which
 * orders them with this pod's own (order.ts: running before sleeping, this pod first, a pod that
 * failed to connect within FAILED_POD_MS last, then the fewest hops in flight from this pod).
 *
 * A traced request's hop is a client span (`cluster.hop`, from before the connection is opened) whose
 * `traceparent` the hop carries (src/directory/trace.ts, outside the signature, which covers method,
 * target, timestamp and body): the receiving pod's front starts its request span under it, so both
 * pods' spans, and its engine's, are one trace.
 */
export const HOP_PREFIX = '/internal/v1'
const NONCE = '?hop='
/** CLIENT_CLUSTER_HEADERS: a client's own copies are not forwarded on a hop (they would sit beside ours and be refused). */
const CLIENT_CLUSTER_HEADERS: readonly string[] = Object.values(CLUSTER_HEADERS)
/** A pod that refused or timed a connection goes last for this long. */
export const FAILED_POD_MS = 10_000
/** A hop's connect deadline when the gateway's is 0 (disabled): a hop always has one. */
const DEFAULT_CONNECT_MS = 5_000

/** HopCluster: what the hop reads of the cluster (ClusterService). */
export interface HopCluster {
  readonly podId: string
  readonly fence: { readonly term: number }
  routingTable(): RoutingTable
  pods(): Pod[]
}

export interface ClusterHopOptions {
  cluster: HopCluster
  inference: GatewayInferenceApi
  /** The host's model directory, to which the other pods are added as backends. */
  directory: ModelDirectory
  /** auth.cluster_secret: hops are signed with the current secret. */
  secret: string
  metrics: Registry
  log: Logger
  /** Unix ms (timestamps, failure marks); tests drive it. */
  now?: () => number
}

/** HopOutcome: the `outcome` label of modelgate_cluster_hops_total. */
export type HopOutcome = 'ok' | 'refused' | 'failed' | 'unreachable' | 'client_gone'

export class ClusterHop implements BackendSource {
  /** The receiving side: `POST /internal/v1/*`, answered with local instances only. */
  readonly rawRoutes: RawRoute[]
  private readonly hops: Counter<'model' | 'pod' | 'outcome'>
  private readonly now: () => number
  /** Hops in flight from this pod, per pod. */
  private readonly outstanding = new Map<string, number>()
  /** When a pod last failed to connect. */
  private readonly failedAt = new Map<string, number>()
  /** When each served name was first listed here (GET /v1/models' `created`). */
  private firstSeen = new Map<string, number>()
  private readonly nonce = `${randomBytes(6).toString('base64url')}.`
  private seq = 0
  private uninstall: (() => void)[] = []

  constructor(private readonly o: ClusterHopOptions) {
    this.now = o.now ?? Date.now
    this.hops = hopCounter(o.metrics)
    this.rawRoutes = [
      {
        match: (path, method) => method === 'POST' && path.startsWith(`${HOP_PREFIX}/`),
        wire: (req) => this.land(req),
      },
    ]
  }

  /** land: a hop another pod sent here, planned on this pod's instances; its span names the sender. */
  private land(req: WireRequest): WireAction {
    const action = this.o.inference.planLocal(req.path.slice(HOP_PREFIX.length), withoutNonce(req.query), req)
    req.trace?.setAttributes({ 'modelgate.hop.from_pod': req.header(CLUSTER_HEADERS.pod) ?? undefined })
    return action
  }

  /** start adds the other pods to the model directory, and their models to the gateway's GET /v1/models. */
  start(): void {
    if (this.uninstall.length > 0) return
    this.uninstall.push(
      this.o.directory.addSource(this),
      this.o.inference.useRemoteModels(() => this.models()),
    )
  }

  stop(): void {
    for (const off of this.uninstall.splice(0)) off()
  }

  /**
   * backends: the other pods that hold `model` in the routing table, one per pod (its best entry),
   * `http://` addresses only (the front forwards on the wire to those only). The directory orders
   * them with every other backend (src/directory/order.ts).
   */
  backends(model: string): readonly Backend[] {
    const entries = hopCandidates(this.o.cluster.routingTable(), model, this.o.cluster.podId)
    if (entries.length === 0) return NONE
    const best = new Map<string, RoutingEntry>()
    for (const e of entries) {
      if (!e.podAddress.startsWith('http://')) continue
      const seen = best.get(e.podId)
      if (!seen || e.weight > seen.weight) best.set(e.podId, e)
    }
    return [...best.values()].map((e) => new PodBackend(this, e, model))
  }

  // ---- what a pod backend reads and reports (per pod, across its models) ----

  inFlight(pod: string): number {
    return this.outstanding.get(pod) ?? 0
  }

  acquire(pod: string): void {
    this.outstanding.set(pod, this.inFlight(pod) + 1)
  }

  release(pod: string): void {
    const left = this.inFlight(pod) - 1
    if (left > 0) this.outstanding.set(pod, left)
    else this.outstanding.delete(pod)
  }

  failedRecently(pod: string): boolean {
    return this.now() - (this.failedAt.get(pod) ?? -Infinity) < FAILED_POD_MS
  }

  /** unreachable: a pod refused or timed the connection (it goes last for FAILED_POD_MS). */
  unreachable(entry: RoutingEntry, model: string, err: unknown): void {
    this.failedAt.set(entry.podId, this.now())
    this.hops.inc({ model, pod: entry.podId, outcome: 'unreachable' })
    this.o.log.warn('cluster hop: pod unreachable, trying the next', {
      pod: entry.podId,
      model,
      error: String(errorCode(err) ?? err),
    })
  }

  /**
   * signed: the signed hop of a leased request to `entry`'s gateway; its end is counted once. `span`:
   * the hop's span when the request is traced (it carries its traceparent and ends with the hop).
   */
  signed(
    entry: RoutingEntry,
    req: BackendRequest,
    lease: LeaseHandle,
    span: TraceSpan | null,
  ): WireForwardAction {
    const { cluster, secret } = this.o
    const query = req.query.length > 1 ? `&${req.query.slice(1)}` : ''
    const nonce = `${NONCE}${this.nonce}${(++this.seq).toString(36)}`
    const to = `&${DESTINATION_PARAM}=${encodeURIComponent(entry.podId)}`
    const target = `${HOP_PREFIX}${req.path}${nonce}${to}${query}`
    const stamp = this.now()
    const signature = signRequest(secret, 'POST', target, stamp, req.body.bytes())
    const forward: WireForwardAction = {
      origin: entry.podAddress,
      target,
      body: req.body,
      dropHeaders: CLIENT_CLUSTER_HEADERS,
      extraHead:
        `${CLUSTER_HEADERS.signature}: ${signature}\r\n${CLUSTER_HEADERS.timestamp}: ${stamp}\r\n` +
        `${CLUSTER_HEADERS.pod}: ${cluster.podId}\r\n${CLUSTER_HEADERS.term}: ${cluster.fence.term}\r\n`,
      // The serving pod applies its own deadlines (and may hold the request while its model wakes):
      // this pod's is a backstop behind them.
      firstByteTimeoutMs: req.firstByteTimeoutMs + req.holdTimeoutMs,
      connectTimeoutMs: req.connectTimeoutMs,
      onEnd: (info) => {
        this.ended(entry, req.model, info)
        lease.end(info)
      },
    }
    return span ? traced(span, forward) : forward
  }

  private ended(entry: RoutingEntry, model: string, info: ForwardEnd): void {
    const pod = entry.podId
    const outcome = outcomeOf(info)
    if (outcome === 'unreachable') this.failedAt.set(pod, this.now())
    this.hops.inc({ model, pod, outcome })
    if (info.error)
      this.o.log.warn('cluster hop failed', { pod, model, status: info.status, error: info.error })
    else if (info.status === 401 || info.status === 403)
      this.o.log.warn('cluster hop refused by the pod: do both pods have the same CLUSTER_SECRET?', {
        pod,
        status: info.status,
      })
  }

  /** models: every model the table lists on another pod where it runs, with that pod's instance. */
  models(): RemoteModel[] {
    const self = this.o.cluster.podId
    const created = Math.floor(this.now() / 1000)
    const seen = new Map<string, number>()
    const out: RemoteModel[] = []
    let pods: Pod[] | null = null
    for (const [name, entries] of Object.entries(this.o.cluster.routingTable().entries)) {
      const entry = entries.find((e) => e.podId !== self && e.weight > 0)
      if (!entry) continue
      pods ??= this.o.cluster.pods()
      const m = pods.find((p) => p.podId === entry.podId)?.models.find((x) => x.modelName === name)
      const first = this.firstSeen.get(name) ?? created
      seen.set(name, first)
      out.push({
        id: name,
        created: first,
        root: m?.modelPath ?? name,
        instance_id: m?.instanceId ?? null,
        pod_id: entry.podId,
        state: m?.status === 'sleeping' ? 'sleeping' : 'active',
      })
    }
    this.firstSeen = seen
    return out
  }
}

/**
 * PodBackend: another pod that holds a model, as the model directory serves it. A request goes to
 * that pod's gateway in one signed hop; when no pooled connection to it is idle, the decision waits
 * (WireAction.defer) until one is open, and a pod that refuses or times the connection hands the
 * request to the next candidate (LeaseHandle.next): a dead pod in a stale table costs time, not a
 * failed request. The open connection goes into the pool, where the forward's exchange takes it.
 */
class PodBackend implements Backend {
  readonly kind = 'pod'
  readonly local = false

  constructor(
    private readonly hop: ClusterHop,
    private readonly entry: RoutingEntry,
    readonly model: string,
  ) {}

  get key(): string {
    return `pod:${this.entry.podId}`
  }

  get podId(): string {
    return this.entry.podId
  }

  /** readiness: where the model runs (weight 1) it serves; a pod where it sleeps wakes it itself. */
  readiness(): Readiness {
    return this.entry.weight > 0 ? 'ready' : 'asleep'
  }

  inFlight(): number {
    return this.hop.inFlight(this.entry.podId)
  }

  acquire(): void {
    this.hop.acquire(this.entry.podId)
  }

  release(): void {
    this.hop.release(this.entry.podId)
  }

  failedRecently(): boolean {
    return this.hop.failedRecently(this.entry.podId)
  }

  forward(req: BackendRequest, lease: LeaseHandle): WireAction {
    const target = upstreams.origin(this.entry.podAddress)
    const span = req.trace ? this.span(req, target) : null
    if (upstreams.idleCount(target) > 0) return { forward: this.hop.signed(this.entry, req, lease, span) }
    const connectMs = req.connectTimeoutMs > 0 ? req.connectTimeoutMs : DEFAULT_CONNECT_MS
    return {
      defer: async (signal) => {
        try {
          // Into the pool: the forward's exchange takes the most recently pooled connection.
          ;(await upstreams.connect(target, connectMs)).release()
        } catch (err) {
          const error =
            errorCode(err) === 'ConnectTimeout' ? upstreamConnectTimeout(connectMs) : upstreamUnavailable(err)
          if (span) endCall(span, unsent(error.code, signal.aborted))
          if (signal.aborted) return lease.next(upstreamUnavailable(err))
          this.hop.unreachable(this.entry, req.model, err)
          return lease.next(error)
        }
        return { forward: this.hop.signed(this.entry, req, lease, span) }
      },
    }
  }

  /** span: the hop's client span under the request's, begun before any connection is opened. */
  private span(req: BackendRequest, target: { hostname: string; port: number }): TraceSpan {
    return callSpan(req.trace!, 'cluster.hop', {
      'http.request.method': 'POST',
      'server.address': target.hostname,
      'server.port': target.port,
      'url.path': `${HOP_PREFIX}${req.path}`,
      'gen_ai.request.model': req.model,
      'modelgate.pod_id': this.entry.podId,
    })
  }
}

const NONE: readonly Backend[] = Object.freeze([])

/** unsent: the outcome of a hop that never left (no connection, or the client went away meanwhile). */
function unsent(error: string, clientGone: boolean): ForwardEnd {
  return {
    status: 502,
    bytes: 0,
    durationMs: 0,
    ttftMs: null,
    streamed: false,
    aborted: clientGone,
    ...(clientGone ? {} : { error }),
  }
}

/** outcomeOf: how a hop ended, for the metric. */
export function outcomeOf(info: ForwardEnd): HopOutcome {
  if (info.aborted) return 'client_gone'
  if (info.error === 'upstream_unavailable' || info.error === 'upstream_connect_timeout') return 'unreachable'
  if (info.error || info.status >= 500) return 'failed'
  return info.status >= 400 ? 'refused' : 'ok'
}

/**
 * withoutNonce: the client's query of a hop, as the client sent it: the nonce and the destination the
 * edge put first removed.
 */
export function withoutNonce(query: string): string {
  if (!query.startsWith(NONCE)) return query
  const parts = query.slice(1).split('&').slice(1)
  if (parts[0]?.startsWith(`${DESTINATION_PARAM}=`)) parts.shift()
  return parts.length === 0 ? '' : `?${parts.join('&')}`
}

/**
 * hopRoutes declares the receiving side for /docs; the front answers it (ClusterHop.rawRoutes) once
 * it has verified the signature, so these declarations only ever see a request under another spelling.
 */
export function hopRoutes() {
  const doc = {
    parse: 'none' as const,
    response: { 400: ProxyError, 401: ProxyError, 502: ProxyError, 503: ProxyError, 504: ProxyError },
    detail: {
      tags: ['internal'],
      summary: 'Inference relayed from another pod (one hop; signed)',
      description:
        'A pod whose `/v1` has no local instance for `model` relays the request here unchanged: ' +
        '`/internal/v1` + the gateway path (e.g. `/internal/v1/v1/chat/completions`), its nonce and ' +
        'destination pod first in the query (`?hop=…&to=<pod id>`, removed before the engine). Answered ' +
        "with this pod's instances only, never relayed again: a model it does not hold is 400 " +
        '`invalid_model`. Errors in the proxy shape.',
    },
  }
  return new Elysia({ name: 'cluster-hop-routes' })
    .post(`${HOP_PREFIX}/:path`, servedByTheFront, doc)
    .post(`${HOP_PREFIX}/*`, servedByTheFront, { parse: 'none', detail: { hide: true } })
}

const HOPS = `${METRIC_PREFIX}cluster_hops_total`

/** hopCounter: modelgate_cluster_hops_total, once per registry. */
function hopCounter(registry: Registry): Counter<'model' | 'pod' | 'outcome'> {
  const existing = registry.getSingleMetric(HOPS)
  if (existing) return existing as Counter<'model' | 'pod' | 'outcome'>
  return new Counter({
    name: HOPS,
    help:
      'Inference requests this pod relayed to another pod, by served model name, pod and outcome ' +
      '(ok, refused: 4xx, failed: 5xx or broken, unreachable: no connection, client_gone)',
    labelNames: ['model', 'pod', 'outcome'],
    registers: [registry],
  })
}
