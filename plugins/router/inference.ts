import type { DirectoryAnswers, ListenerPlan, ModelDirectory } from '../../src/directory/directory.ts'
import { queueFull, serverStopping } from '../../src/directory/hold-queue.ts'
import type { RawRoute } from '../../src/host/plugin.ts'
import { inferenceAuthorization } from '../../src/http/credentials.ts'
import { AppError, proxyError } from '../../src/http/errors.ts'
import type { WireAction, WireRequest } from '../../src/wire/route.ts'
import type { GatewayKeyGate } from './access.ts'
import { readInferenceBody } from './body.ts'
import type { RouterConfig } from './config.ts'
import { modelNotFound, modelWaking, wakeFailed } from './errors.ts'
import type { ModelEntry, ModelTable } from './model-table.ts'
import type { TrafficCounter } from './stats.ts'

/**
 * RouterInference is the router's hot path: `POST /v1/chat/completions`, `/v1/completions`,
 * `/v1/responses` (OpenAI's Responses API) and `/v1/messages` (Anthropic's Messages API),
 * served as raw routes on the router listener (the same per-request cost as the gateway's /v1).
 * It finds the model in the router's table, then the model directory (src/directory) plans the
 * request as it does the gateway's: a forward holding a lease on a backend (the configured
 * endpoint, or one of the gateway's instances of that served name), or, for a model that sleeps,
 * its wake (reject, or hold), or a refusal in the router's words. Every request naming a known
 * model is counted in the traffic statistics when it has ended, whatever its end; 2xx is a
 * success. A request refused for the gateway's inference key (GatewayKeyGate, judged from the head
 * where it can be and again once the model is known) is not: it neither counts nor touches the
 * model, so a caller without the key can neither skew a gateway model's statistics nor keep it
 * from auto-sleep, and it never reaches the engine or starts a wake. A key's grant goes with a
 * request for a gateway model to the directory (its model allowlist, concurrency, usage).
 */
export const INFERENCE_PATHS: readonly string[] = [
  '/v1/chat/completions',
  '/v1/completions',
  '/v1/responses',
  '/v1/messages',
]

export interface InferenceDeps {
  table: ModelTable
  directory: ModelDirectory
  overall: TrafficCounter
  cfg: RouterConfig
  /** gate: the gateway's inference key for gateway models (and unknown names), see access.ts. */
  gate: GatewayKeyGate
  /** the router's clock (epoch ms): activity and statistics. */
  now: () => number
  /** changed: a request ended (its traffic counted): the dashboard's feed. */
  changed?: () => void
}

/** ROUTER_ANSWERS: the directory's refusals in the router's words (`{error: {message, type, code}}`). */
const ROUTER_ANSWERS: DirectoryAnswers = {
  unknown: (model) => modelNotFound(model),
  waking: (model, seconds, message) => modelWaking(model, seconds, message),
  starting: (model, seconds) =>
    modelWaking(model, seconds ?? 10, `Model '${model}' is still loading; retry in ${seconds ?? 10} s`),
  wakeFailed: (model, reason) => wakeFailed(model, reason),
  queueFull: queueFull,
  stopping: serverStopping,
  unavailable: (model) =>
    proxyError(
      503,
      'service_unavailable',
      'model_unavailable',
      `Model '${model}' cannot serve now`,
      undefined,
      {
        'retry-after': '5',
      },
    ),
}

const paths = new Set(INFERENCE_PATHS)

export class RouterInference {
  /** plans: each model's listener plan, made once (its kinds and books are the entry's for good). */
  private readonly plans = new WeakMap<ModelEntry, ListenerPlan>()

  constructor(private readonly deps: InferenceDeps) {}

  private planFor(entry: ModelEntry): ListenerPlan {
    let plan = this.plans.get(entry)
    if (plan === undefined) {
      const { cfg } = this.deps
      plan = {
        policy: cfg.wake_on_request,
        holdTimeoutMs: cfg.hold_timeout * 1000,
        answers: ROUTER_ANSWERS,
        kinds: entry.kinds,
        books: { ended: (status, durationMs) => this.recordEnd(entry, status, durationMs) },
      }
      this.plans.set(entry, plan)
    }
    return plan
  }

  rawRoutes(): RawRoute[] {
    return [
      {
        match: (path, method) => method === 'POST' && paths.has(path),
        admit: (head) => this.deps.gate.admit(inferenceAuthorization(head)),
        wire: (req) => this.wire(req),
      },
    ]
  }

  /** wire decides every inference request on the listener's front (see the class comment). */
  wire(req: WireRequest): WireAction {
    const fields = readInferenceBody(req.json())
    if (fields instanceof AppError) return { error: fields }
    const entry = this.deps.table.get(fields.model)
    const grant = this.deps.gate.check(entry, req.grant, inferenceAuthorization(req))
    if (grant instanceof AppError) return { error: grant }
    // Traced from here: a request refused for the key is not (like the gateway's, refused from its head).
    const trace = req.startTrace(req.path, fields.model)
    if (!entry) return { error: modelNotFound(fields.model) }
    entry.touch(this.deps.now())
    if (fields.invalid) return { error: this.refusal(entry, fields.invalid, req.startedAt) }
    const { cfg } = this.deps
    return this.deps.directory.plan(
      fields.model,
      {
        path: req.path,
        enginePath: req.path,
        query: req.query,
        body: req.body,
        json: fields.json,
        startedAt: req.startedAt,
        firstByteTimeoutMs: cfg.proxy.first_byte_timeout_ms,
        connectTimeoutMs: cfg.proxy.connect_timeout_ms,
        // A key governs the gateway's models; a standalone endpoint model needs none and counts none.
        grant,
        trace,
      },
      this.planFor(entry),
    )
  }

  private refusal(entry: ModelEntry, err: AppError, startedAt: number): AppError {
    this.recordEnd(entry, err.status, performance.now() - startedAt)
    return err
  }

  private recordEnd(entry: ModelEntry, status: number, durationMs: number): void {
    const now = this.deps.now()
    const ok = status >= 200 && status < 300
    entry.traffic.record(now, ok, durationMs)
    this.deps.overall.record(now, ok, durationMs)
    entry.touch(now)
    this.deps.changed?.()
  }
}
