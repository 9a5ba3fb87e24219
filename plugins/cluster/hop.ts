import { randomBytes } from 'node:crypto'
import { Elysia } from 'elysia'
import { Counter, type Registry } from 'prom-client'
import type { Logger } from '../../src/host/logger.ts'
import { METRIC_PREFIX } from '../../src/host/metrics.ts'
import type { RawRoute } from '../../src/host/plugin.ts'
import { ProxyError } from '../../src/http/schemas.ts'
import { servedByTheFront } from '../../src/wire/openai-routes.ts'
import { upstreams } from '../../src/wire/pool.ts'
import type { ForwardEnd, WireAction, WireForwardAction } from '../../src/wire/route.ts'
import { errorCode, upstreamConnectTimeout, upstreamUnavailable } from '../../src/wire/upstream-errors.ts'
import type { GatewayInferenceApi, RemoteModel, RemoteRequest, RemoteResolver } from '../gateway/api.ts'
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
 * Candidates: pods other than this one that hold the model, a pod that failed to connect within
 * FAILED_POD_MS last, then running (weight 1) before sleeping, then the fewest hops in flight from
 * this pod, then the table's order. When no pooled connection to the first is idle, the decision
 * waits (WireAction.defer) until a connection to a candidate is open, trying the next on a failed
 * connect: a dead pod in a stale table costs time, not a failed request. The open connection goes
 * into the pool, where the forward's exchange takes it.
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
  /** auth.cluster_secret: hops are signed with the current secret. */
  secret: string
  metrics: Registry
  log: Logger
  /** Unix ms (timestamps, failure marks); tests drive it. */
  now?: () => number
}

/** HopOutcome: the `outcome` label of modelgate_cluster_hops_total. */
export type HopOutcome = 'ok' | 'refused' | 'failed' | 'unreachable' | 'client_gone'

export class ClusterHop implements RemoteResolver {
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
  private uninstall: (() => void) | null = null

  constructor(private readonly o: ClusterHopOptions) {
    this.now = o.now ?? Date.now
    this.hops = hopCounter(o.metrics)
    const inference = o.inference
    this.rawRoutes = [
      {
        match: (path, method) => method === 'POST' && path.startsWith(`${HOP_PREFIX}/`),
        wire: (req) => inference.planLocal(req.path.slice(HOP_PREFIX.length), withoutNonce(req.query), req),
      },
    ]
  }

  /** start installs this resolver into the gateway's /v1. */
  start(): void {
    this.uninstall ??= this.o.inference.useRemote(this)
  }

  stop(): void {
    this.uninstall?.()
    this.uninstall = null
  }

  plan(req: RemoteRequest): WireAction | null {
    const order = this.candidates(req.model, req.runningOnly)
    const first = order[0]
    if (!first) return null
    if (upstreams.idleCount(upstreams.origin(first.podAddress)) > 0)
      return { forward: this.forward(first, req) }
    const startedAt = performance.now()
    return { defer: (signal) => this.reach(order, req, signal, startedAt) }
  }

  /**
   * candidates: the pods to try for `model`, best first (see the class comment); one entry per pod
   * (its best), only `http://` addresses (the front forwards on the wire to those only).
   */
  candidates(model: string, runningOnly: boolean): RoutingEntry[] {
    const best = new Map<string, RoutingEntry>()
    for (const e of hopCandidates(this.o.cluster.routingTable(), model, this.o.cluster.podId)) {
      if ((runningOnly && e.weight <= 0) || !e.podAddress.startsWith('http://')) continue
      const seen = best.get(e.podId)
      if (!seen || e.weight > seen.weight) best.set(e.podId, e)
    }
    if (best.size < 2) return [...best.values()]
    const now = this.now()
    const failed = (e: RoutingEntry) =>
      now - (this.failedAt.get(e.podId) ?? -Infinity) < FAILED_POD_MS ? 1 : 0
    const load = (e: RoutingEntry) => this.outstanding.get(e.podId) ?? 0
    return [...best.values()].sort(
      (a, b) => failed(a) - failed(b) || b.weight - a.weight || load(a) - load(b),
    )
  }

  /**
   * reach opens a connection to the first candidate that answers and forwards there; when none does,
   * the last failure is the answer (502 upstream_unavailable, or 504 upstream_connect_timeout).
   */
  private async reach(
    order: RoutingEntry[],
    req: RemoteRequest,
    signal: AbortSignal,
    startedAt: number,
  ): Promise<WireAction> {
    let last: unknown = null
    let lastPod = order[0]!.podId
    const connectMs = req.connectTimeoutMs > 0 ? req.connectTimeoutMs : DEFAULT_CONNECT_MS
    for (const entry of order) {
      if (signal.aborted) break
      const target = upstreams.origin(entry.podAddress)
      if (upstreams.idleCount(target) === 0) {
        try {
          // Into the pool: the forward's exchange takes the most recently pooled connection.
          ;(await upstreams.connect(target, connectMs)).release()
        } catch (err) {
          last = err
          lastPod = entry.podId
          this.failedAt.set(entry.podId, this.now())
          this.hops.inc({ model: req.model, pod: entry.podId, outcome: 'unreachable' })
          this.o.log.warn('cluster hop: pod unreachable, trying the next', {
            pod: entry.podId,
            model: req.model,
            error: String(errorCode(err) ?? err),
          })
          continue
        }
      }
      return { forward: this.forward(entry, req) }
    }
    const error =
      errorCode(last) === 'ConnectTimeout' ? upstreamConnectTimeout(connectMs) : upstreamUnavailable(last)
    const durationMs = performance.now() - startedAt
    const info: ForwardEnd = {
      status: signal.aborted ? 499 : error.status,
      bytes: 0,
      durationMs,
      ttftMs: null,
      streamed: false,
      aborted: signal.aborted,
    }
    if (!signal.aborted) info.error = error.code
    req.record(info, lastPod)
    return { error }
  }

  /** forward: the signed hop to `entry`'s gateway; its end is counted and reported once. */
  private forward(entry: RoutingEntry, req: RemoteRequest): WireForwardAction {
    const { cluster, secret } = this.o
    const query = req.query.length > 1 ? `&${req.query.slice(1)}` : ''
    const nonce = `${NONCE}${this.nonce}${(++this.seq).toString(36)}`
    const to = `&${DESTINATION_PARAM}=${encodeURIComponent(entry.podId)}`
    const target = `${HOP_PREFIX}${req.path}${nonce}${to}${query}`
    const stamp = this.now()
    const signature = signRequest(secret, 'POST', target, stamp, req.body.bytes())
    const pod = entry.podId
    this.outstanding.set(pod, (this.outstanding.get(pod) ?? 0) + 1)
    return {
      origin: entry.podAddress,
      target,
      body: req.body,
      dropHeaders: CLIENT_CLUSTER_HEADERS,
      extraHead:
        `${CLUSTER_HEADERS.signature}: ${signature}\r\n${CLUSTER_HEADERS.timestamp}: ${stamp}\r\n` +
        `${CLUSTER_HEADERS.pod}: ${cluster.podId}\r\n${CLUSTER_HEADERS.term}: ${cluster.fence.term}\r\n`,
      firstByteTimeoutMs: req.firstByteTimeoutMs,
      connectTimeoutMs: req.connectTimeoutMs,
      onEnd: (info) => this.ended(entry, req, info),
    }
  }

  private ended(entry: RoutingEntry, req: RemoteRequest, info: ForwardEnd): void {
    const pod = entry.podId
    const left = (this.outstanding.get(pod) ?? 1) - 1
    if (left > 0) this.outstanding.set(pod, left)
    else this.outstanding.delete(pod)
    const outcome = outcomeOf(info)
    if (outcome === 'unreachable') this.failedAt.set(pod, this.now())
    this.hops.inc({ model: req.model, pod, outcome })
    if (info.error)
      this.o.log.warn('cluster hop failed', { pod, model: req.model, status: info.status, error: info.error })
    else if (info.status === 401 || info.status === 403)
      this.o.log.warn('cluster hop refused by the pod: do both pods have the same CLUSTER_SECRET?', {
        pod,
        status: info.status,
      })
    req.record(info, pod)
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
      })
    }
    this.firstSeen = seen
    return out
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
