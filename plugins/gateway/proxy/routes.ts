import type { Registry } from 'prom-client'
import type { BackendKind } from '../../../src/directory/backend.ts'
import type { ListenerPlan, ModelDirectory } from '../../../src/directory/directory.ts'
import { engineCall, traced } from '../../../src/directory/trace.ts'
import type { WakePolicy } from '../../../src/directory/wake.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import type { AnyElysia, RawRoute } from '../../../src/host/plugin.ts'
import { capped } from '../../../src/host/telemetry/telemetry.ts'
import { type AppError, proxyError } from '../../../src/http/errors.ts'
import { DEFAULT_JSON_DEPTH, modelOf, scanRefusal } from '../../../src/wire/model-field.ts'
import { openaiRoutes } from '../../../src/wire/openai-routes.ts'
import { upstreams } from '../../../src/wire/pool.ts'
import type { InferenceGrant, WireAction, WireForwardAction, WireRequest } from '../../../src/wire/route.ts'
import { askForUsage, charged, requestCost, USAGE_STREAMS, type UsageMode } from '../../../src/wire/usage.ts'
import type {
  GatewayApi,
  GatewayInferenceApi,
  InstanceStatus,
  ListedModel,
  ListedState,
  RemoteModel,
} from '../api.ts'
import { GATEWAY_ANSWERS } from './answers.ts'
import { ProxyMetrics } from './metrics.ts'

/**
 * createInference builds the gateway's inference proxy: the OpenAI-compatible routes (`/v1/...`,
 * `/tokenize` and friends), `GET /v1/models` and `ALL /api/direct/:port/*`. They are the main
 * listener's hot routes, answered on its front (inference key already checked from the head), and
 * declared in Elysia for /docs only. Where a request goes is the model directory's to say
 * (src/directory: this pod's instances, or in a cluster another pod that serves the model, one
 * hop; a sleeping model is woken by the request, `wake_on_request`: reject with Retry-After, or
 * hold until it is awake); moving bytes is the front's (WireExchange). Each proxied request holds a
 * lease on its backend until its response has fully ended, then is announced once on the bus as
 * `proxy.request` and counted in the metrics. `planLocal` plans with this pod's instances only, for
 * requests another pod relayed here, so a request never crosses a second hop.
 */
export interface InferenceDeps {
  api: GatewayApi
  /** The host's model directory: where the gateway's instances are served from, with every other backend. */
  directory: ModelDirectory
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
  '/v1/responses': '/v1/responses',
  '/v1/messages': '/v1/messages',
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
  'POST /v1/messages',
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

/** DIRECT_SPAN_ROUTES: each direct route's http.route in its span (`/api/direct/{port}/v1/chat/completions`). */
const DIRECT_SPAN_ROUTES: ReadonlyMap<string, string> = new Map(
  [...DIRECT_ROUTES].map((r) => [r, `${DIRECT}{port}${r.slice(r.indexOf(' ') + 1)}`]),
)

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
      wire: (req) => ({ json: handlers.modelList(req.grant) }),
    },
    {
      match: (path) => path.startsWith(DIRECT),
      wire: (req) => handlers.planDirect(req),
    },
  ]
  return { rawRoutes, routes: openaiRoutes({ tag: 'gateway', paths: ENGINE_PATHS, direct: true }), handlers }
}

/**
 * GATEWAY_KINDS: what the gateway's `/v1` serves: its instances, and in a cluster the pods that
 * serve a model (one hop). LOCAL_KINDS: what a pod serves a hop it received (never a second hop).
 */
/** LISTED_STATES: how `GET /v1/models` names an instance's status (stopping and failed ones are not listed). */
const LISTED_STATES: Partial<Record<InstanceStatus, ListedState>> = {
  active: 'active',
  sleeping: 'sleeping',
  starting: 'loading',
}
/** STATE_RANK: which state a name's entry shows when several of its instances differ (lower first). */
const STATE_RANK: Record<ListedState, number> = { active: 0, loading: 1, sleeping: 2, unloaded: 3 }

const GATEWAY_KINDS: ReadonlySet<BackendKind> = new Set(['instance', 'pod'])
const LOCAL_KINDS: ReadonlySet<BackendKind> = new Set(['instance'])

/**
 * GatewayInference plans each inference request once: the model directory (src/directory) says
 * where it goes (an instance here, or another pod) or why not, and wakes what sleeps; the front
 * carries the decision out.
 */
export class GatewayInference implements GatewayInferenceApi {
  private readonly plan: ListenerPlan
  private readonly local: ListenerPlan
  private remoteModels: (() => RemoteModel[]) | null = null
  /** When this gateway started (Unix seconds): `created` of a catalogue entry from the YAML. */
  private readonly startedAt = Math.floor(Date.now() / 1000)

  constructor(private readonly deps: InferenceDeps) {
    const metrics = new ProxyMetrics(deps.metrics)
    this.plan = {
      kinds: GATEWAY_KINDS,
      policy: deps.config.wakeOnRequest ?? 'reject',
      holdTimeoutMs: (deps.config.holdTimeoutSeconds ?? 120) * 1000,
      answers: GATEWAY_ANSWERS,
    }
    this.local = { ...this.plan, kinds: LOCAL_KINDS }
    // The gateway's instances are served from the directory, and every wake of one is measured
    // there (whoever started it: a request, the API, the router), from its operation beginning to
    // the instance becoming active: the Retry-After every listener gives.
    deps.directory.addSource({ backends: (name) => deps.api.backends(name) })
    deps.bus.on('gateway.instance.lifecycle', (e) => {
      const { change } = e
      const record = () => deps.directory.record(e.served_model_name)
      if (change.kind === 'operation' && change.operation === 'wake') {
        if (change.running) record().started(e.at)
        else record().ended()
      } else if (change.kind === 'state' && change.previous === 'sleeping' && change.current === 'active')
        record().succeeded(e.at)
    })
    // Every request that reached an instance, or this pod relayed to another pod, is counted,
    // whichever listener took it (the directory announces each once).
    deps.bus.on('proxy.request', (e) => {
      const series = e.instance_id ?? (e.pod_id ? (e.served ?? e.model) : null)
      if (series) metrics.observe(series, e.status, e.duration_ms)
    })
  }

  planModel(req: WireRequest): WireAction {
    return this.planPath(req.path, req.query, req, this.plan)
  }

  planLocal(path: string, query: string, req: WireRequest): WireAction {
    return this.planPath(path, query, req, this.local)
  }

  useRemoteModels(list: () => RemoteModel[]): () => void {
    this.remoteModels = list
    return () => {
      if (this.remoteModels === list) this.remoteModels = null
    }
  }

  /**
   * planPath: a model route's request, its model read from the body's scan (never parsed whole).
   * Traced (every request the route takes, a refused body included), its span goes with the plan.
   */
  private planPath(path: string, query: string, req: WireRequest, plan: ListenerPlan): WireAction {
    const enginePath = enginePaths.get(path)
    if (enginePath === undefined) return { error: notFound('POST', path) }
    const json = req.json()
    if (typeof json === 'string') {
      req.startTrace(path)
      return { error: scanRefusal(json, this.deps.config.maxJsonDepth ?? DEFAULT_JSON_DEPTH) }
    }
    const model = modelOf(json)
    if (typeof model !== 'string') {
      req.startTrace(path)
      return { error: model }
    }
    const { config } = this.deps
    return this.deps.directory.plan(
      model,
      {
        path,
        enginePath,
        query,
        body: req.body,
        json,
        startedAt: req.startedAt,
        firstByteTimeoutMs: config.firstByteTimeoutMs,
        connectTimeoutMs: config.connectTimeoutMs,
        grant: req.grant,
        trace: req.startTrace(path, model),
      },
      plan,
    )
  }

  /**
   * modelList: `GET /v1/models`, every model a client may name here, once each by its name: this
   * pod's instances (active, sleeping, loading), the catalogue's entries not loaded (a request loads
   * them), then the models other pods of the cluster serve (with the pod that serves one). `state`
   * says which; with a key, only the models on its list. No engine address is given.
   */
  modelList(grant: InferenceGrant | null): { object: 'list'; data: ListedModel[] } {
    const listed = new Map<string, ListedModel>()
    const may = (name: string) => !listed.has(name) && (grant === null || grant.lists(name))
    for (const i of this.deps.api.list()) {
      const state = LISTED_STATES[i.status]
      if (state === undefined) continue
      const seen = listed.get(i.served_model_name)
      if (seen) {
        // Replicas of one name: the entry says the most a request finds (one active serves it).
        if (STATE_RANK[state] < STATE_RANK[seen.state]) Object.assign(seen, { state, instance_id: i.id })
        continue
      }
      if (!may(i.served_model_name)) continue
      listed.set(i.served_model_name, {
        id: i.served_model_name,
        object: 'model',
        created: Math.floor(Date.parse(i.ready_at ?? i.loaded_at) / 1000),
        owned_by: 'modelgate',
        root: i.model_path,
        max_model_len: i.max_tokens ?? i.memory_metrics?.max_model_len ?? null,
        state,
        instance_id: i.id,
      })
    }
    for (const e of this.deps.api.catalog()) {
      if (!may(e.name)) continue
      listed.set(e.name, {
        id: e.name,
        object: 'model',
        created: e.updated_at ? Math.floor(Date.parse(e.updated_at) / 1000) : this.startedAt,
        owned_by: 'modelgate',
        root: e.model_path,
        max_model_len: e.max_tokens,
        state: 'unloaded',
        instance_id: null,
      })
    }
    for (const m of this.remoteModels?.() ?? []) {
      if (!may(m.id)) continue
      const { id, created, root, instance_id, pod_id, state } = m
      listed.set(id, {
        id,
        object: 'model',
        created,
        owned_by: 'modelgate',
        root,
        max_model_len: null,
        state,
        instance_id,
        pod_id,
      })
    }
    return { object: 'list', data: [...listed.values()] }
  }

  /**
   * planDirect: `/api/direct/{port}/…` to the engine on that port, bypassing model routing. A request
   * with a key is held to it as a model route's is: the engine's served name must be a model the key
   * may use, and it counts (concurrency, usage: a chat or completion stream is made to ask for its
   * usage). Its span has the http.route `/api/direct/{port}/…` and the engine call under it.
   */
  planDirect(req: WireRequest): WireAction {
    const { method, path, query } = req
    let body = req.body
    const rest = path.slice(DIRECT.length)
    const slash = rest.indexOf('/')
    const portText = slash < 0 ? rest : rest.slice(0, slash)
    const subPath = slash < 0 ? '/' : rest.slice(slash)
    const route = DIRECT_SPAN_ROUTES.get(`${method} ${subPath}`)
    if (route === undefined)
      return {
        error: proxyError(
          404,
          'invalid_request_error',
          'not_found',
          `The direct proxy forwards an engine's inference routes only, not ${method} ${subPath}`,
        ),
      }
    const trace = req.startTrace(route)
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
    const grant = req.grant
    let usage: UsageMode | undefined
    if (grant) {
      const scanned = method === 'POST' && (grant.metered || USAGE_STREAMS.has(subPath)) ? req.json() : null
      const json = scanned !== null && typeof scanned !== 'string' ? scanned : null
      const worst = grant.metered ? requestCost(body.length, json, lease.contextTokens) : 0
      const denied = grant.begin(lease.servedModelName, worst)
      if (denied) {
        lease.release()
        grant.end(denied.status, null)
        return { error: denied }
      }
      usage = 'read'
      if (json !== null && USAGE_STREAMS.has(subPath)) {
        const asked = askForUsage(body, json)
        body = asked.body
        if (asked.strip) usage = 'strip'
      }
    }
    const { config } = this.deps
    const forward: WireForwardAction = {
      origin: lease.baseUrl,
      target: subPath + query,
      body,
      firstByteTimeoutMs: config.firstByteTimeoutMs,
      connectTimeoutMs: config.connectTimeoutMs,
      ...(usage ? { usage } : {}),
      onEnd: (info) => {
        lease.release()
        grant?.end(info.status, charged(info, body.length))
        this.deps.bus.emit('proxy.request', {
          model: lease.servedModelName,
          instance_id: lease.instanceId,
          status: info.status,
          duration_ms: info.durationMs,
          ttft_ms: info.ttftMs,
          streamed: info.streamed,
          path,
        })
        if (info.error)
          this.deps.log.warn('upstream failure', {
            instance_id: lease.instanceId,
            path,
            status: info.status,
            error: info.error,
            ms: Math.round(info.durationMs),
          })
      },
    }
    if (!trace) return { forward }
    // Traced only: the model the body names (the direct proxy reads no body otherwise).
    const json = method === 'POST' ? req.json() : null
    const model = json !== null && typeof json !== 'string' ? json.string('model') : undefined
    const served = lease.servedModelName
    trace.setAttributes({
      'gen_ai.request.model': model === undefined ? undefined : capped(model),
      'gen_ai.response.model': served,
    })
    const host = upstreams.origin(lease.baseUrl).hostname
    const call = engineCall(
      trace,
      { host, port, path: subPath, model: served },
      { 'modelgate.instance_id': lease.instanceId },
    )
    return { forward: traced(call, forward) }
  }
}

function notFound(method: string, path: string): AppError {
  return proxyError(404, 'invalid_request_error', 'not_found', `No route for ${method} ${path}`)
}
