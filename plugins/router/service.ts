import { ViewPublisher } from '../../src/dashboard/publisher.ts'
import { EngineCallError } from '../../src/engine/engine-client.ts'
import type { PluginContext } from '../../src/host/plugin.ts'
import { AppError } from '../../src/http/errors.ts'
import type { GatewayApi } from '../gateway/api.ts'
import { GatewayKeyGate } from './access.ts'
import type { EndpointBackend } from './backends.ts'
import type { RouterConfig } from './config.ts'
import type { RouterOverview } from './dashboard/changes.ts'
import { ActionRefused, modelNotFound } from './errors.ts'
import { RouterInference } from './inference.ts'
import { type ModelEntry, ModelTable } from './model-table.ts'
import { refuseWithoutEngine, SleepController } from './sleep.ts'
import { TrafficCounter } from './stats.ts'
import {
  iso,
  type ModelTrafficView,
  type ModelView,
  modelTrafficView,
  modelView,
  type SleepStatusView,
  seconds,
  sleepStatusView,
} from './views.ts'

/**
 * RouterService is the traffic-routing controller: the model table (configured endpoints plus,
 * with from_gateway, the gateway's instances), the sleep state machine with auto-sleep, traffic
 * statistics and health. It knows nothing of HTTP routing; routes.ts renders what it returns.
 */
export interface ActionResult {
  status: 'success' | 'error'
  model: string
  message: string
  timestamp?: string
  min_sleep_duration?: number
  actual_sleep_duration?: number
}

/** ActionOutcome: the result body and its HTTP status (200, 409 refusal, 502 engine). */
export interface ActionOutcome {
  httpStatus: 200 | 409 | 502
  body: ActionResult
}

export const CONTROLLER_NAME = 'modelgate-router'

export class RouterService {
  readonly startedAt: number
  readonly table: ModelTable
  readonly overall = new TrafficCounter()
  readonly sleep: SleepController
  readonly inference: RouterInference
  /** gate: the gateway's inference key for gateway models on the inference routes and the actions. */
  readonly gate: GatewayKeyGate
  /** changes: publishes the overview the dashboard's Router page draws (`router.changed`). */
  readonly changes: ViewPublisher<'router.changed'>
  private readonly lifetime = new AbortController()
  private unsubscribe: (() => void)[] = []
  private gatewayApi: GatewayApi | undefined

  constructor(
    readonly cfg: RouterConfig,
    private readonly ctx: PluginContext,
    /**
     * now: the router's clock (epoch ms), read for statistics windows, activity, idle and sleep
     * times. Tests pass one they can move forward; deadlines and timers run on real time.
     */
    readonly now: () => number = Date.now,
  ) {
    this.startedAt = now()
    this.changes = new ViewPublisher(ctx.bus, 'router.changed', () => this.overview())
    const changed = () => this.changes.nudge()
    this.table = new ModelTable(cfg, this.startedAt, ctx.directory, ctx.log)
    // Fixed by the configuration (not by start()), so it holds from the moment the listener opens.
    this.gate = new GatewayKeyGate(ctx.auth, cfg.from_gateway && ctx.has('gateway'), cfg.models.length > 0)
    this.sleep = new SleepController({
      table: this.table,
      directory: ctx.directory,
      cfg,
      log: ctx.log,
      startedAt: this.startedAt,
      lifetime: this.lifetime.signal,
      now,
      changed,
    })
    this.inference = new RouterInference({
      table: this.table,
      directory: ctx.directory,
      overall: this.overall,
      cfg,
      gate: this.gate,
      now,
      changed,
    })
    // The configured endpoints are backends of the host's model directory, served by this listener.
    this.unsubscribe.push(ctx.directory.addSource({ backends: (name) => endpointOf(this.table, name) }))
  }

  /** start follows the gateway (when on and asked to), reads every engine's sleep state, starts the timer. */
  async start(): Promise<void> {
    if (this.cfg.from_gateway && this.ctx.has('gateway')) {
      const api = this.ctx.optionalApi<GatewayApi>('gateway')
      if (api) {
        this.gatewayApi = api
        this.table.followGateway(api)
        this.unsubscribe.push(
          // Traffic through the gateway's own /v1 keeps a gateway model from looking idle.
          this.ctx.bus.on('proxy.request', (ev) => {
            if (ev.instance_id) this.table.get(ev.served ?? ev.model)?.touch(this.now())
            this.changes.nudge()
          }),
          // A gateway instance came, went, slept or woke: the router's models and their states.
          this.ctx.bus.on('gateway.instance.status', () => this.changes.nudge()),
        )
      }
    }
    await Promise.all(this.table.endpoints().map((ep) => this.sleep.refresh(ep)))
    this.sleep.start()
    this.ctx.log.info('router ready', {
      models: [...this.table.all()].map((e) => e.name),
      from_gateway: this.gatewayApi !== undefined,
      auto_sleep: this.cfg.auto_sleep.enabled,
    })
  }

  async stop(): Promise<void> {
    this.changes.stop()
    for (const off of this.unsubscribe.splice(0)) off()
    this.lifetime.abort()
    await this.sleep.stop()
  }

  require(name: string): ModelEntry {
    const e = this.table.get(name)
    if (!e) throw modelNotFound(name)
    return e
  }

  // ---- views ----

  /** overview: what the dashboard's Router page draws, in one read (and in each `router.changed`). */
  overview(): RouterOverview {
    return {
      models: this.models().data,
      traffic: this.trafficStats(null),
      sleep: this.sleepStatus().models,
      candidates: this.sleepCandidates(),
    }
  }

  models(): { object: 'list'; data: ModelView[] } {
    return { object: 'list', data: this.table.all().map((e) => modelView(e, true)) }
  }

  /**
   * modelsFor: `GET /models` and `/v1/models` for the caller whose Authorization this is (access.ts,
   * GatewayKeyGate.viewer): the models it may use, their engine addresses for an admin only.
   */
  async modelsFor(authorization: string | null): Promise<{ object: 'list'; data: ModelView[] }> {
    const viewer = await this.gate.viewer(authorization)
    if (viewer instanceof AppError) throw viewer
    const data = this.table
      .all()
      .filter((e) => viewer.sees(e))
      .map((e) => modelView(e, viewer.addresses))
    return { object: 'list', data }
  }

  idleModels(threshold: number) {
    const now = this.now()
    const idle_models = []
    for (const e of this.table.all()) {
      const idleMs = e.idleMs(now, this.startedAt)
      if (idleMs >= threshold * 1000)
        idle_models.push({ model: e.name, idle_time: seconds(idleMs), last_activity: iso(e.lastActivity) })
    }
    return { idle_models, threshold }
  }

  activeModels(threshold: number, windowSeconds: number | null) {
    const now = this.now()
    const window = windowSeconds ?? threshold
    const active_models = []
    for (const e of this.table.all()) {
      if (e.lastActivity === null && e.busy() === 0) continue
      const since = e.idleMs(now, this.startedAt)
      if (since >= threshold * 1000) continue
      active_models.push({
        model: e.name,
        last_activity: iso(e.lastActivity),
        seconds_since_activity: seconds(since),
        request_count: e.traffic.snapshot(now, window, this.startedAt).total_requests,
      })
    }
    return { active_models, threshold }
  }

  trafficStats(windowSeconds: number | null) {
    const now = this.now()
    const by_model: Record<string, Omit<ModelTrafficView, 'model' | 'idle_time'>> = {}
    for (const e of this.table.all()) {
      const { model: _m, idle_time: _i, ...rest } = modelTrafficView(e, now, windowSeconds, this.startedAt)
      by_model[e.name] = rest
    }
    return { overall: this.overall.snapshot(now, windowSeconds, this.startedAt), by_model }
  }

  modelTraffic(name: string, windowSeconds: number | null): ModelTrafficView {
    return modelTrafficView(this.require(name), this.now(), windowSeconds, this.startedAt)
  }

  sleepStatus(): { models: Record<string, SleepStatusView> } {
    const now = this.now()
    const models: Record<string, SleepStatusView> = {}
    for (const e of this.table.all()) models[e.name] = sleepStatusView(e, now)
    return { models }
  }

  sleepCandidates() {
    const now = this.now()
    const threshold = this.cfg.auto_sleep.idle_threshold
    const candidates = []
    for (const e of this.table.all()) {
      if (!this.sleep.isCandidate(e, now, threshold * 1000)) continue
      candidates.push({
        model: e.name,
        idle_time: seconds(e.idleMs(now, this.startedAt)),
        last_activity: iso(e.lastActivity),
        threshold,
      })
    }
    return { candidates, auto_sleep_enabled: this.cfg.auto_sleep.enabled, idle_threshold: threshold }
  }

  health() {
    let active = 0
    let sleeping = 0
    for (const e of this.table.all()) {
      // A model with no engine (unloaded, loading) is neither.
      if (e.state === 'active') active++
      else if (e.state === 'sleeping' || e.state === 'waking') sleeping++
    }
    const now = this.now()
    return {
      status: 'healthy' as const,
      timestamp: new Date(now).toISOString(),
      uptime: seconds(now - this.startedAt),
      models_active: active,
      models_sleeping: sleeping,
    }
  }

  async modelHealth(name: string) {
    const e = this.require(name)
    const backend = e.backends()[0]
    const endpoint = backend?.address?.() ?? { host: '', port: 0 }
    const probe = backend?.health
      ? await backend.health(this.cfg.health_timeout_ms, this.lifetime.signal)
      : { ok: false as const, error: 'no instance' }
    if (probe.ok)
      return { model: e.name, status: 'healthy' as const, endpoint, response_time: round6(probe.seconds) }
    return { model: e.name, status: 'unhealthy' as const, endpoint, error: probe.error }
  }

  serverInfo() {
    return { version: this.ctx.version, controller: CONTROLLER_NAME }
  }

  // ---- actions ----

  /**
   * requireForAction: the model an action names, once the caller may act on it. The key check
   * comes before the lookup (an unknown name needs the key as a gateway model does), so a caller
   * without it gets 401 whether or not the name exists; a key whose model list leaves the model out
   * gets 403 `model_not_allowed`, as its inference would; `authorization` is the request's
   * Authorization header value.
   */
  private requireForAction(name: string, authorization: string | null): ModelEntry {
    const e = this.table.get(name)
    const verdict = this.gate.check(e, null, authorization)
    if (verdict instanceof AppError) throw verdict
    if (!e) throw modelNotFound(name)
    // A key limited to other models may not sleep or wake this one either.
    const denied = verdict?.allows(e.name) ?? null
    if (denied) throw denied
    return e
  }

  async sleepAction(name: string, authorization: string | null): Promise<ActionOutcome> {
    const e = this.requireForAction(name, authorization)
    try {
      await this.sleep.sleep(e, this.cfg.auto_sleep.level as 1 | 2)
    } catch (err) {
      return this.actionFailure(e, err)
    }
    return success(e, 'Model put to sleep', this.now())
  }

  async wakeAction(name: string, authorization: string | null): Promise<ActionOutcome> {
    const e = this.requireForAction(name, authorization)
    try {
      const s = e.sleep
      refuseWithoutEngine(s.status)
      if (s.status === 'waking' || e.endpoint?.wakePromise)
        throw new ActionRefused('Model is already waking up')
      if (s.operation === 'sleep')
        throw new ActionRefused('Model is going to sleep; try again when it sleeps')
      if (s.status === 'active') throw new ActionRefused('Model is already active')
      const min = this.cfg.auto_sleep.min_sleep_duration
      const slept = seconds(this.now() - (s.since ?? this.startedAt))
      if (slept < min)
        throw new ActionRefused(
          `Model has been sleeping for ${slept} s; the minimum sleep duration is ${min} s`,
          { min_sleep_duration: min, actual_sleep_duration: slept },
        )
      this.ctx.directory.record(e.name).clearFailure() // an operator's explicit wakeup retries at once
      await this.sleep.wake(e)
    } catch (err) {
      return this.actionFailure(e, err)
    }
    return success(e, 'Model woken up', this.now())
  }

  private actionFailure(e: ModelEntry, err: unknown): ActionOutcome {
    if (err instanceof ActionRefused)
      return { httpStatus: 409, body: { status: 'error', model: e.name, message: err.message, ...err.extra } }
    if (err instanceof EngineCallError)
      return { httpStatus: 502, body: { status: 'error', model: e.name, message: err.message } }
    throw err
  }
}

function success(e: ModelEntry, message: string, at: number): ActionOutcome {
  return {
    httpStatus: 200,
    body: { status: 'success', model: e.name, message, timestamp: new Date(at).toISOString() },
  }
}

const round6 = (x: number) => Math.round(x * 1e6) / 1e6

/** endpointOf: the router's directory source: a configured name's endpoint (none for other names). */
function endpointOf(table: ModelTable, name: string): readonly EndpointBackend[] {
  return table.endpointList(name) ?? NO_ENDPOINTS
}

/** NO_ENDPOINTS: the answer for every name not configured here (every request asks every source). */
const NO_ENDPOINTS: readonly EndpointBackend[] = Object.freeze([])
