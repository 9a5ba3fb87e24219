import type { SleepReason } from '../../src/directory/backend.ts'
import type { ModelDirectory } from '../../src/directory/directory.ts'
import { EngineCallError, waitHealthy } from '../../src/engine/engine-client.ts'
import { abortable } from '../../src/host/abortable.ts'
import type { Logger } from '../../src/host/logger.ts'
import { AppError } from '../../src/http/errors.ts'
import type { EndpointBackend } from './backends.ts'
import type { RouterConfig } from './config.ts'
import { ActionRefused } from './errors.ts'
import type { ModelEntry, ModelTable, SleepStateName } from './model-table.ts'

/**
 * SleepController is the router's sleep policy and, for its configured endpoints, their sleep
 * state machine:
 *
 *     active ──sleep──▶ sleeping ──wake──▶ waking ──engine awake──▶ active
 *
 * - Auto-sleep (every check_interval): a model idle past idle_threshold, active, with nothing in
 *   flight or held and no operation under way is put to sleep. A model never used counts as idle
 *   since the router started. For a gateway model the sleep is the host's residency manager's idle
 *   rule (one owner of what is resident): a pinned catalogue model is never a candidate, and each
 *   sleep is one of the manager's decisions (GET /api/residency, reason `idle`).
 * - Manual actions are refused (ActionRefused → 409) when the state does not allow them; the
 *   minimum sleep duration only limits the manual wakeup, a request may always wake a model.
 * - A sleep never cuts a request: it drains the model first, and a request arriving while it
 *   drains cancels it (the model is in use). A gateway model is slept by the gateway, instance by
 *   instance (its drain counts the router's requests too: they hold leases on its instances).
 * - An endpoint's wake is one shared promise however many requests and operators wait on it (the
 *   model directory's wake on request calls it through the endpoint's `waker`); after level 2 it
 *   runs vLLM's reload sequence (backends.ts). A gateway model's wake is each instance's own one.
 * - Configured engines are re-read (`/is_sleeping`) at start and at every check, so a restart, or a
 *   sleep done behind the router's back, is noticed.
 * - Every wake of an endpoint is measured into the directory's record of the model (the one
 *   Retry-After estimate and retry delay after a failure), as the gateway measures its instances'.
 */
export interface SleepControllerDeps {
  table: ModelTable
  directory: ModelDirectory
  cfg: RouterConfig
  log: Logger
  startedAt: number
  /** aborted when the router stops: ends engine calls. */
  lifetime: AbortSignal
  /** the router's clock (epoch ms): sleep times and idle times. */
  now: () => number
  /** changed: what a model's sleep state or candidacy may have changed (the dashboard's feed). */
  changed?: () => void
}

/** STOP_WAIT_MS caps how long stop waits for sleep or wake operations under way. */
const STOP_WAIT_MS = 5000

export class SleepController {
  private timer: ReturnType<typeof setInterval> | undefined
  private readonly running = new Set<Promise<unknown>>()
  /** the sleeps under way, by model name, each cancellable while it drains. */
  private readonly draining = new Map<string, AbortController>()

  constructor(private readonly deps: SleepControllerDeps) {
    for (const ep of deps.table.endpoints()) ep.waker = () => this.wakeEndpoint(ep)
  }

  start(): void {
    this.timer = setInterval(() => this.tick(), this.deps.cfg.auto_sleep.check_interval * 1000)
  }

  /**
   * stop clears the timer and waits a little for operations under way. Calls to configured engines
   * end with the router's lifetime signal; a gateway model's sleep or wake cannot be cancelled, so
   * the wait is capped (the gateway, which stops after the router, ends those engines anyway).
   */
  async stop(): Promise<void> {
    clearInterval(this.timer)
    this.timer = undefined
    await abortable(Promise.allSettled([...this.running]), { timeoutMs: STOP_WAIT_MS }).catch(() => {})
  }

  private track<T>(p: Promise<T>): Promise<T> {
    this.running.add(p)
    this.deps.changed?.()
    p.finally(() => {
      this.running.delete(p)
      this.deps.changed?.()
    }).catch(() => {})
    return p
  }

  /** tick: per model, put it to sleep when it is an auto-sleep candidate, else re-read a configured engine. */
  tick(): void {
    const { table, cfg, log, startedAt } = this.deps
    const now = this.deps.now()
    // Idle time passing makes candidates of models without any other change.
    this.deps.changed?.()
    const thresholdMs = cfg.auto_sleep.idle_threshold * 1000
    for (const e of table.all()) {
      if (cfg.auto_sleep.enabled && this.isCandidate(e, now, thresholdMs)) {
        log.info('auto-sleep of an idle model', {
          model: e.name,
          idle_seconds: Math.round(e.idleMs(now, startedAt) / 1000),
        })
        try {
          this.sleep(e, cfg.auto_sleep.level as 1 | 2, 'idle').catch((err: Error) =>
            log.warn('auto-sleep failed', { model: e.name, error: err.message }),
          )
        } catch (err) {
          log.debug('auto-sleep skipped', { model: e.name, reason: (err as Error).message })
        }
      } else if (e.endpoint && !e.endpoint.op) void this.refresh(e.endpoint)
    }
  }

  /** isCandidate: what auto-sleep would put to sleep now (also GET /sleep/candidates). */
  isCandidate(e: ModelEntry, now: number, thresholdMs: number): boolean {
    const s = e.sleep
    return (
      s.status === 'active' &&
      s.operation === null &&
      (e.endpoint?.wakePromise ?? null) === null &&
      e.sleepable() !== false &&
      !e.pinned() &&
      e.busy() === 0 &&
      e.idleMs(now, this.deps.startedAt) >= thresholdMs
    )
  }

  /** refresh re-reads a configured engine's sleep state, unless an operation started meanwhile. */
  async refresh(ep: EndpointBackend): Promise<void> {
    const generation = ep.generation
    let sleeping: boolean | null
    try {
      sleeping = await ep.isSleeping(this.deps.cfg.health_timeout_ms, this.deps.lifetime)
    } catch {
      return // unreachable now: keep what we know
    }
    if (sleeping === null || ep.op || ep.generation !== generation) return
    if (sleeping && ep.state === 'active') {
      ep.state = 'sleeping'
      ep.sleepTime = this.deps.now()
      this.deps.log.info('engine found asleep', { model: ep.model })
    } else if (!sleeping && ep.state === 'sleeping') {
      ep.state = 'active'
      ep.sleepTime = null
      ep.sleepLevel = null
      this.deps.log.info('engine found awake', { model: ep.model })
    }
  }

  /**
   * sleep puts an active model to sleep (manual or automatic) without cutting a request (see the
   * class comment). Refusals throw ActionRefused at once; the returned promise rejects with
   * ActionRefused (drain deadline passed, cancelled) or EngineCallError (no answer).
   */
  sleep(e: ModelEntry, level: 1 | 2, why: SleepReason = 'operator'): Promise<void> {
    const s = e.sleep
    refuseWithoutEngine(s.status)
    if (s.status === 'sleeping') throw new ActionRefused('Model is already sleeping')
    if (s.operation === 'sleep') throw new ActionRefused('Model is already going to sleep')
    if (s.status === 'waking' || e.endpoint?.wakePromise) throw new ActionRefused('Model is waking up')
    if (e.sleepable() === false) throw new ActionRefused('Model does not support sleep mode')
    const cancel = new AbortController()
    this.draining.set(e.name, cancel)
    const forget = () => {
      if (this.draining.get(e.name) === cancel) this.draining.delete(e.name)
    }
    const ep = e.endpoint
    if (!ep) {
      const targets = e
        .backends()
        .filter((b) => b.sleepState?.()?.status === 'active' && b.sleepable?.() === true)
      if (targets.length === 0) {
        forget()
        throw new ActionRefused('Model does not support sleep mode')
      }
      return this.track(settleAll(targets.map((b) => b.sleep!(level, cancel.signal, why))).finally(forget))
    }
    ep.op = 'sleep'
    ep.generation++
    const p = (async () => {
      try {
        await ep.sleepEngine(level, cancel.signal, this.deps.lifetime)
        ep.state = 'sleeping'
        ep.sleepTime = this.deps.now()
        ep.sleepLevel = level
        this.deps.log.info('model asleep', { model: e.name, level })
      } finally {
        forget()
        ep.op = null
        ep.opPromise = null
      }
    })()
    ep.opPromise = p
    return this.track(p)
  }

  /**
   * wake starts (or joins) the wake of a model: a sleep still draining is cancelled (someone wants
   * the model), then an endpoint's one wake, or every sleeping instance's of a gateway model.
   * Resolves when it serves; rejects with EngineCallError (ActionRefused for a gateway refusal).
   */
  wake(e: ModelEntry): Promise<void> {
    this.draining.get(e.name)?.abort()
    if (e.endpoint) return this.wakeEndpoint(e.endpoint)
    const sleepers = e.backends().filter((b) => b.sleepState?.()?.status !== 'active')
    return this.track(settleAll(sleepers.map((b) => this.deps.directory.wake(b))))
  }

  /** wakeEndpoint: the endpoint's one wake (its `waker`: requests reach it through the directory). */
  private wakeEndpoint(ep: EndpointBackend): Promise<void> {
    this.draining.get(ep.model)?.abort()
    if (ep.wakePromise) return ep.wakePromise
    const failure = this.recentWakeFailure(ep.model)
    if (failure) return Promise.reject(new EngineCallError(failure, null))
    if (ep.state === 'active' && ep.op !== 'sleep') return Promise.resolve()
    const p = (async () => {
      try {
        if (ep.op === 'sleep') await ep.opPromise?.catch(() => {})
        if (ep.state !== 'sleeping') return
        await this.runWake(ep)
      } finally {
        ep.wakePromise = null
      }
    })()
    ep.wakePromise = p
    return this.track(p)
  }

  private async runWake(ep: EndpointBackend): Promise<void> {
    const { log, cfg, lifetime } = this.deps
    const record = this.deps.directory.record(ep.model)
    ep.op = 'wake'
    ep.generation++
    ep.state = 'waking'
    const t0 = performance.now()
    record.started(t0)
    const p = (async () => {
      try {
        await ep.wakeEngine(ep.sleepLevel, cfg.auto_sleep.level as 1 | 2, lifetime)
        const health = await this.awaitHealthy(ep, cfg.control_timeout * 1000)
        if (!health) throw new EngineCallError('engine did not answer /health after waking up', null)
        ep.state = 'active'
        ep.sleepTime = null
        ep.sleepLevel = null
        record.succeeded(performance.now())
        log.info('model awake', { model: ep.model, ms: Math.round(performance.now() - t0) })
      } catch (err) {
        ep.state = 'sleeping'
        record.failed(performance.now(), (err as Error).message)
        throw err
      } finally {
        ep.op = null
        ep.opPromise = null
      }
    })()
    ep.opPromise = p
    await p
  }

  /** awaitHealthy polls the engine's /health after a wake_up until 200, the deadline or the router stops. */
  private async awaitHealthy(ep: EndpointBackend, deadlineMs: number): Promise<boolean> {
    const { cfg, lifetime } = this.deps
    const probe = {
      health: async (timeoutMs = cfg.health_timeout_ms, o: { signal?: AbortSignal } = {}) =>
        (await ep.health(timeoutMs, o.signal ?? lifetime)).ok,
    }
    const outcome = await waitHealthy(probe, {
      initialMs: 25,
      maxMs: 1000,
      deadlineMs,
      probeMs: cfg.health_timeout_ms,
      signal: lifetime,
    })
    return outcome === 'healthy'
  }

  /** recentWakeFailure names the model's last wake failure while its retry delay lasts, else null. */
  recentWakeFailure(model: string): string | null {
    return this.deps.directory.record(model).recentFailure(performance.now())
  }
}

/**
 * refuseWithoutEngine: a model with no engine (a catalogued model with no instance, or one whose
 * instance still loads) can be neither slept nor woken: it does not sleep. A request loads it.
 */
export function refuseWithoutEngine(status: SleepStateName): void {
  if (status === 'unloaded') throw new ActionRefused('Model is not loaded (a request loads it)')
  if (status === 'loading') throw new ActionRefused('Model is loading')
}

/** settleAll waits for every call and rethrows the first failure as the router's error kinds. */
async function settleAll(calls: Promise<unknown>[]): Promise<void> {
  const results = await Promise.allSettled(calls)
  for (const r of results) {
    if (r.status === 'fulfilled') continue
    const err = r.reason
    if (err instanceof AppError && err.status >= 500) throw new EngineCallError(err.message, null)
    if (err instanceof AppError) throw new ActionRefused(err.message)
    if (err instanceof ActionRefused || err instanceof EngineCallError) throw err
    throw new EngineCallError((err as Error).message, null)
  }
}
