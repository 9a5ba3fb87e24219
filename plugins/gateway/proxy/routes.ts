import type { Registry } from 'prom-client'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import type { AnyElysia, RawRoute } from '../../../src/host/plugin.ts'
import { AppError, proxyError, toAppError } from '../../../src/http/errors.ts'
import type { BodyRange } from '../../../src/wire/body-range.ts'
import type { ScannedJson } from '../../../src/wire/json-scan.ts'
import { DEFAULT_JSON_DEPTH, modelOf, replaceModel, scanRefusal } from '../../../src/wire/model-field.ts'
import { openaiRoutes } from '../../../src/wire/openai-routes.ts'
import type { ForwardEnd, WireAction, WireRequest } from '../../../src/wire/route.ts'
import { WakeOnRequest, type WakePolicy } from '../../../src/wire/wake-on-request.ts'
import type { GatewayApi, GatewayInferenceApi, Lease, RemoteResolver } from '../api.ts'
import { ProxyMetrics } from './metrics.ts'
import { GATEWAY_WAKE_ANSWERS, GatewayWakes } from './wake.ts'

/**
 * createInference builds the gateway's inference proxy: the OpenAI-compatible routes (`/v1/...`,
 * `/tokenize` and friends), `GET /v1/models` and `ALL /api/direct/:port/*`. They are the main
 * listener's hot routes, answered on its front (inference key already checked there), and declared
 * in Elysia for /docs only. Bodies are forwarded as sent, except that a `model` naming the
 * instance by id or model path is replaced by the served name the engine answers to (a splice of
 * that one JSON string). Model resolution and load balancing are the gateway's
 * (`api.acquire`); moving bytes is the front's (WireExchange). Each proxied request holds a lease on its instance
 * until its response has fully ended, then is counted in the metrics and announced on the bus as
 * `proxy.request`. A model that sleeps is woken by the request (`wake_on_request`: reject with
 * Retry-After, or hold until it is awake; src/wire/wake-on-request.ts, the router's mechanism too).
 *
 * In a cluster, a model no local instance can take is handed to the remote resolver the cluster
 * installs (`useRemote`, GatewayInferenceApi): one hop to a pod that serves it, counted here as a
 * proxied request labelled by the served model name. `planLocal` is the same planning without the
 * resolver, for requests another pod relayed here, so a request never crosses a second hop.
 */
export interface InferenceDeps {
  api: GatewayApi
  bus: EventBus
  metrics: Registry
  log: Logger
  config: {
    firstByteTimeoutMs: number
    connectTimeoutMs: number
    /** The main listener's keep-alive idle timeout (server.idle_timeout_seconds), restored after a request. */
    idleTimeoutSeconds?: number
    /** proxy.wake_on_request: a sleeping model's request is refused with Retry-After, or held (default reject). */
    wakeOnRequest?: WakePolicy
    /** proxy.hold_timeout: seconds a held request waits (default 120). */
    holdTimeoutSeconds?: number
    /** server.max_json_depth (the listener's limit, which req.json() applies), named in its refusal. */
    maxJsonDepth?: number
  }
}

/** ENGINE_PATHS maps each model route of the gateway to the engine's path. */
export const ENGINE_PATHS: Readonly<Record<string, string>> = {
  '/v1/chat/completions': '/v1/chat/completions',
  '/v1/completions': '/v1/completions',
  '/v1/embeddings': '/v1/embeddings',
  '/tokenize': '/tokenize',
  '/detokenize': '/detokenize',
  '/pooling': '/pooling',
  '/classification': '/classify',
  '/score': '/score',
  '/re-rank': '/rerank',
}

const enginePaths = new Map(Object.entries(ENGINE_PATHS))
const DIRECT = '/api/direct/'

/**
 * DIRECT_ROUTES: what `/api/direct/{port}/…` forwards, as `METHOD /path` on the engine: its
 * inference routes (OpenAI's and vLLM's own), nothing else, whatever the method. The direct proxy
 * answers to the inference key, and an engine also serves routes that control it without any
 * check of its own (vLLM's `/sleep`, `/wake_up`, `/collective_rpc`, `/reset_prefix_cache`... in dev
 * mode, which sleep mode needs, and whatever later releases add): with them a key holder could put
 * an engine to sleep behind the gateway's back or call any worker method. Those go through the
 * admin API only; anything not listed here is 404 and never reaches the engine.
 */
export const DIRECT_ROUTES: ReadonlySet<string> = new Set([
  'GET /v1/models',
  'POST /v1/chat/completions',
  'POST /v1/completions',
  'POST /v1/embeddings',
  'POST /v1/responses',
  'POST /v1/audio/transcriptions',
  'POST /v1/audio/translations',
  'POST /v1/score',
  'POST /v1/rerank',
  'POST /v2/rerank',
  'POST /rerank',
  'POST /score',
  'POST /classify',
  'POST /pooling',
  'POST /tokenize',
  'POST /detokenize',
])

export function createInference(deps: InferenceDeps): {
  rawRoutes: RawRoute[]
  routes: AnyElysia
  handlers: GatewayInference
} {
  const handlers = new GatewayInference(deps)
  const rawRoutes: RawRoute[] = [
    {
      match: (path, method) => method === 'POST' && enginePaths.has(path),
      wire: (req) => handlers.planModel(req),
    },
    {
      match: (path, method) => method === 'GET' && path === '/v1/models',
      wire: () => ({ json: handlers.modelList() }),
    },
    {
      match: (path) => path.startsWith(DIRECT),
      wire: (req) => handlers.planDirect(req.method, req.path, req.query, req.body),
    },
  ]
  return { rawRoutes, routes: openaiRoutes({ tag: 'gateway', paths: ENGINE_PATHS, direct: true }), handlers }
}

/**
 * GatewayInference decides each inference request once (`planModel`, `planDirect`: an error, or a
 * forward holding a lease on the instance); the front carries the decision out.
 */
export class GatewayInference implements GatewayInferenceApi {
  private readonly metrics: ProxyMetrics
  private readonly sleepers: GatewayWakes
  private readonly wakes: WakeOnRequest
  /** The cluster's remote resolver, consulted only when no local instance can take a request. */
  private remote: RemoteResolver | null = null

  constructor(private readonly deps: InferenceDeps) {
    this.metrics = new ProxyMetrics(deps.metrics)
    this.sleepers = new GatewayWakes(deps.api, deps.bus)
    this.wakes = new WakeOnRequest({
      policy: deps.config.wakeOnRequest ?? 'reject',
      holdTimeoutMs: (deps.config.holdTimeoutSeconds ?? 120) * 1000,
      answers: GATEWAY_WAKE_ANSWERS,
      log: deps.log,
      bus: deps.bus,
      metrics: deps.metrics,
    })
    // Every request that reached an instance is counted, whoever proxied it (the router emits too).
    deps.bus.on('proxy.request', (e) => {
      if (e.instance_id) this.metrics.observe(e.instance_id, e.status, e.duration_ms)
    })
  }

  planModel(req: WireRequest): WireAction {
    return this.plan(req.path, req.query, req, req.query)
  }

  planLocal(path: string, query: string, req: WireRequest): WireAction {
    return this.plan(path, query, req, null)
  }

  /** plan: a model route's request, its model read from the body's scan (never parsed whole). */
  private plan(path: string, query: string, req: WireRequest, hopQuery: string | null): WireAction {
    const enginePath = enginePaths.get(path)
    if (enginePath === undefined) return { error: notFound('POST', path) }
    const json = req.json()
    if (typeof json === 'string')
      return { error: scanRefusal(json, this.deps.config.maxJsonDepth ?? DEFAULT_JSON_DEPTH) }
    const model = modelOf(json)
    if (typeof model !== 'string') return { error: model }
    return this.serve(model, enginePath + query, req.body, path, false, hopQuery, json)
  }

  useRemote(resolver: RemoteResolver): () => void {
    this.remote = resolver
    return () => {
      if (this.remote === resolver) this.remote = null
    }
  }

  /**
   * serve forwards to an instance of `model`, or wakes it when it sleeps (`afterWake`: the request
   * was held for a wake; a model asleep again is refused, not woken again). `hopQuery`: the client's
   * query when the request may hop to another pod (null: local instances only).
   */
  private serve(
    model: string,
    target: string,
    body: BodyRange,
    path: string,
    afterWake: boolean,
    hopQuery: string | null,
    json: ScannedJson,
  ): WireAction {
    let lease: Lease
    try {
      lease = this.deps.api.acquire(model)
    } catch (err) {
      if (hopQuery !== null && this.remote !== null) {
        const hop = this.hop(err, model, path, hopQuery, body)
        if (hop) return hop
      }
      if (!afterWake && err instanceof AppError && err.code === 'model_sleeping') {
        const sleeping = this.sleepers.sleeping(model, err)
        if (sleeping)
          return this.wakes.answer(sleeping, {
            ready: () => this.serve(model, target, body, path, true, hopQuery, json),
          })
      }
      return { error: this.refusal(err, path) }
    }
    // The engine answers only to its served name: an instance id or model path is swapped for it.
    const served = lease.servedModelName
    const bytes = served && model !== served ? replaceModel(body, served, json) : body
    return this.forwardTo(lease, target, bytes, model, path)
  }

  /**
   * hop asks the remote resolver for a request acquire refused: any pod when no local instance
   * matches (400 invalid_model), only a pod where it runs when the local one is starting or asleep.
   * null: no pod can take it, and the local refusal (or wake) stands.
   */
  private hop(err: unknown, model: string, path: string, query: string, body: BodyRange): WireAction | null {
    if (!(err instanceof AppError)) return null
    const code = err.code
    const runningOnly = code !== 'invalid_model'
    if (runningOnly && code !== 'model_sleeping' && code !== 'model_not_ready') return null
    const { config } = this.deps
    return this.remote!.plan({
      model,
      path,
      query,
      body,
      runningOnly,
      connectTimeoutMs: config.connectTimeoutMs,
      // The serving pod applies its own deadlines (and may hold the request while its model wakes):
      // this pod's is a backstop behind them.
      firstByteTimeoutMs: config.firstByteTimeoutMs + (config.holdTimeoutSeconds ?? 120) * 1000,
      record: (info, podId) => this.recordHop(model, path, podId, info),
    })
  }

  /** recordHop counts a relayed request as a proxied one, labelled by the served model name. */
  private recordHop(model: string, path: string, podId: string, info: ForwardEnd): void {
    this.metrics.observe(model, info.status, info.durationMs)
    this.deps.bus.emit('proxy.request', {
      model,
      instance_id: null,
      status: info.status,
      duration_ms: info.durationMs,
      ttft_ms: info.ttftMs,
      streamed: info.streamed,
      path,
      pod_id: podId,
    })
  }

  /**
   * modelList: `GET /v1/models`, every active instance once by served name and once by id, then the
   * models other pods of the cluster serve (by served name, with the pod that serves it).
   */
  modelList(): { object: 'list'; data: Record<string, unknown>[] } {
    const data: Record<string, unknown>[] = []
    const seen = new Set<string>()
    for (const i of this.deps.api.list()) {
      if (i.status !== 'active') continue
      const created = Math.floor(Date.parse(i.ready_at ?? i.loaded_at) / 1000)
      const max = i.max_tokens ?? i.memory_metrics?.max_model_len ?? null
      for (const id of [i.served_model_name, i.id]) {
        if (seen.has(id)) continue
        seen.add(id)
        data.push({
          id,
          object: 'model',
          created,
          owned_by: 'modelgate',
          root: i.model_path,
          max_model_len: max,
          instance_id: i.id,
        })
      }
    }
    for (const m of this.remote?.models() ?? []) {
      if (seen.has(m.id)) continue
      seen.add(m.id)
      const { id, created, root, instance_id, pod_id } = m
      data.push({
        id,
        object: 'model',
        created,
        owned_by: 'modelgate',
        root,
        max_model_len: null,
        instance_id,
        pod_id,
      })
    }
    return { object: 'list', data }
  }

  planDirect(method: string, path: string, query: string, body: BodyRange): WireAction {
    const rest = path.slice(DIRECT.length)
    const slash = rest.indexOf('/')
    const portText = slash < 0 ? rest : rest.slice(0, slash)
    const subPath = slash < 0 ? '/' : rest.slice(slash)
    if (!DIRECT_ROUTES.has(`${method} ${subPath}`))
      return {
        error: proxyError(
          404,
          'invalid_request_error',
          'not_found',
          `The direct proxy forwards an engine's inference routes only, not ${method} ${subPath}`,
        ),
      }
    const port = /^\d{1,5}$/.test(portText) ? Number(portText) : Number.NaN
    const lease = port >= 1 && port <= 65535 ? this.deps.api.acquireByPort(port) : null
    if (!lease) {
      return {
        error: proxyError(
          404,
          'invalid_request_error',
          'unknown_port',
          `No engine managed by this gateway listens on port ${portText}`,
        ),
      }
    }
    const model = lease.servedModelName
    return this.forwardTo(lease, subPath + query, body, model, path)
  }

  /** forwardTo: the forward of a leased request; its end releases the lease and records the request. */
  private forwardTo(lease: Lease, target: string, body: BodyRange, model: string, path: string): WireAction {
    const { config } = this.deps
    return {
      forward: {
        origin: lease.baseUrl,
        target,
        body,
        firstByteTimeoutMs: config.firstByteTimeoutMs,
        connectTimeoutMs: config.connectTimeoutMs,
        onEnd: (info) => {
          lease.release()
          this.record(lease, model, path, info)
        },
      },
    }
  }

  private record(lease: Lease, model: string, path: string, info: ForwardEnd): void {
    const instanceId = lease.instanceId
    this.deps.bus.emit('proxy.request', {
      model,
      instance_id: instanceId,
      status: info.status,
      duration_ms: info.durationMs,
      ttft_ms: info.ttftMs,
      streamed: info.streamed,
      path,
    })
    if (info.error) {
      this.deps.log.warn('upstream failure', {
        instance_id: instanceId,
        path,
        status: info.status,
        error: info.error,
        ms: Math.round(info.durationMs),
      })
    }
  }

  /** refusal: acquire's refusals (400 invalid_model, 503 not ready / sleeping), for the proxy shape. */
  private refusal(err: unknown, path: string): AppError {
    if (!(err instanceof AppError))
      this.deps.log.error('model resolution failed', { path, error: String(err) })
    return toAppError(err)
  }
}

function notFound(method: string, path: string): AppError {
  return proxyError(404, 'invalid_request_error', 'not_found', `No route for ${method} ${path}`)
}
