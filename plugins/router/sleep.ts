import { EngineCallError, waitHealthy } from '../../src/engine/vllm-client.ts'
import { abortable, WaitError } from '../../src/host/abortable.ts'
import type { Logger } from '../../src/host/logger.ts'
import type { EndpointBackend } from './backends.ts'
import type { RouterConfig } from './config.ts'
import { ActionRefused } from './errors.ts'
import type { ModelEntry, ModelTable } from './model-table.ts'

/**
 * SleepController is the sleep state machine of every model:
 *
 *     active ──sleep──▶ sleeping ──wake──▶ waking ──engine awake──▶ active
 *
 * - An operation (`op`) owns the state while it runs; there is at most one per model. A wake is
 *   one shared promise however many requests wait on it; a wake asked for while the model is still
 *   falling asleep runs right after the sleep.
 * - Manual actions are refused (ActionRefused → 409) when the state does not allow them; the
 *   minimum sleep duration only limits the manual wakeup, a request may always wake a model.
 * - A sleep never cuts a request: it drains the model first (see `sleep`), and a request arriving
 *   while it drains cancels it. A wake after level 2 runs vLLM's reload sequence (backends.ts).
 * - Auto-sleep (every check_interval): a model idle past idle_threshold, active, with nothing in
 *   flight and no operation under way is put to sleep. A model never used counts as idle since
 *   the router started.
 * - Configured engines are re-read (`/is_sleeping`) at start and at every check, so a restart, or a
 *   sleep done behind the router's back, is noticed.
 */
export interface SleepControllerDeps {
  table: ModelTable
  cfg: RouterConfig
  log: Logger
  startedAt: number
  /** aborted when the router stops: ends engine calls and held requests. */
  lifetime: AbortSignal
  /** the router's clock (epoch ms): sleep times, idle times, wake durations and retry delays. */
  now: () => number
}

/** STOP_WAIT_MS caps how long stop waits for sleep or wake operations under way. */
const STOP_WAIT_MS = 5000
/** WAKE_RETRY_MS: after a failed wake, requests are refused (502 wake_failed) this long before a new try. */
export const WAKE_RETRY_MS = 10_000

export class SleepController {
  private timer: ReturnType<typeof setInterval> | undefined
  private readonly running = new Set<Promise<unknown>>()
  /** the sleeps under way, each cancellable while it drains. */
  private readonly draining = new Map<ModelEntry, AbortController>()

  constructor(private readonly deps: SleepControllerDeps) {}

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
    p.finally(() => this.running.delete(p)).catch(() => {})
    return p
  }

  /**
   * tick: re-sync the gateway models, then per model: put it to sleep when it is an auto-sleep
   * candidate, else re-read a configured engine's sleep state.
   */
  tick(): void {
    const { table, cfg, log, startedAt } = this.deps
    table.syncGateway()
    const now = this.deps.now()
    const thresholdMs = cfg.auto_sleep.idle_threshold * 1000
    for (const e of table.all()) {
      if (cfg.auto_sleep.enabled && this.isCandidate(e, now, thresholdMs)) {
        log.info('auto-sleep of an idle model', {
          model: e.name,
          idle_seconds: Math.round(e.idleMs(now, startedAt) / 1000),
        })
        try {
          this.sleep(e, cfg.auto_sleep.level as 1 | 2).catch((err: Error) =>
            log.warn('auto-sleep failed', { model: e.name, error: err.message }),
          )
        } catch (err) {
          log.debug('auto-sleep skipped', { model: e.name, reason: (err as Error).message })
        }
      } else if (!e.gateway && !e.op) void this.refresh(e)
    }
  }

  /** isCandidate: what auto-sleep would put to sleep now (also GET /sleep/candidates). */
  isCandidate(e: ModelEntry, now: number, thresholdMs: number): boolean {
    return (
      e.state === 'active' &&
      e.op === null &&
      e.wakePromise === null &&
      e.backend.sleepable() !== false &&
      e.busy() === 0 &&
      e.idleMs(now, this.deps.startedAt) >= thresholdMs
    )
  }

  /** refresh re-reads a configured engine's sleep state, unless an operation started meanwhile. */
  async refresh(e: ModelEntry): Promise<void> {
    const backend = e.backend
    if (backend.kind !== 'endpoint') return
    const generation = e.generation
    let sleeping: boolean | null
    try {
      sleeping = await (backend as EndpointBackend).isSleeping(
        this.deps.cfg.health_timeout_ms,
        this.deps.lifetime,
      )
    } catch {
      return // unreachable now: keep what we know
    }
    if (sleeping === null || e.op || e.generation !== generation) return
    if (sleeping && e.state === 'active') {
      e.state = 'sleeping'
      e.sleepTime = this.deps.now()
      this.deps.log.info('engine found asleep', { model: e.name })
    } else if (!sleeping && e.state === 'sleeping') {
      e.state = 'active'
      e.sleepTime = null
      e.sleepLevel = null
      this.deps.log.info('engine found awake', { model: e.name })
    }
  }

  /**
   * sleep puts an active model to sleep (manual or automatic) without cutting a request: new
   * requests stop going to the engine at once (`op = 'sleep'` sends them to the wake path), the
   * requests in flight finish (drain), then the engine sleeps. A configured endpoint is drained on
   * the router's own count of what it forwards there, up to control_timeout; a gateway model by
   * the gateway (whose leases count the router's requests too), up to its
   * plugins.gateway.sleep.drain_timeout_ms. A request that arrives while the sleep drains cancels
   * it: the model is in use. Refusals throw ActionRefused at once; the returned promise rejects
   * with ActionRefused (drain deadline passed, cancelled) or EngineCallError (no answer).
   */
  sleep(e: ModelEntry, level: 1 | 2): Promise<void> {
    if (e.state === 'sleeping') throw new ActionRefused('Model is already sleeping')
    if (e.op === 'sleep') throw new ActionRefused('Model is already going to sleep')
    if (e.state === 'waking' || e.wakePromise) throw new ActionRefused('Model is waking up')
    if (e.backend.sleepable() === false) throw new ActionRefused('Model does not support sleep mode')
    e.op = 'sleep'
    e.generation++
    const cancel = new AbortController()
    this.draining.set(e, cancel)
    const p = (async () => {
      try {
        if (!e.gateway) await this.drain(e, cancel.signal)
        await e.backend.sleep(level, { signal: this.deps.lifetime, cancel: cancel.signal })
        e.state = 'sleeping'
        e.sleepTime = this.deps.now()
        e.sleepLevel = level
        this.deps.log.info('model asleep', { model: e.name, level })
      } finally {
        this.draining.delete(e)
        e.op = null
        e.opPromise = null
      }
    })()
    e.opPromise = p
    return this.track(p)
  }

  /**
   * drain waits until the requests the router forwards to a configured endpoint have ended (the
   * entry wakes it when its last one ends); the wait ends at control_timeout (ActionRefused: the
   * model keeps serving), when a request arrives (`cancel`) or when the router stops.
   */
  private async drain(e: ModelEntry, cancel: AbortSignal): Promise<void> {
    const open = e.inFlight
    if (open === 0) return
    const { cfg, log, lifetime } = this.deps
    log.info('waiting for requests in flight before sleeping', { model: e.name, in_flight: open })
    try {
      await abortable(e.idle(), {
        signal: AbortSignal.any([cancel, lifetime]),
        timeoutMs: cfg.control_timeout * 1000,
        what: 'the requests in flight',
      })
    } catch (err) {
      if (!(err instanceof WaitError)) throw err
      if (lifetime.aborted) throw new EngineCallError('the router is stopping', null)
      if (cancel.aborted)
        throw new ActionRefused(
          `A request arrived while the sleep waited for ${e.inFlight} request(s) in flight; the model keeps serving`,
        )
      throw new ActionRefused(
        `Model still has ${e.inFlight} request(s) in flight after ${cfg.control_timeout} s; ` +
          'it was not put to sleep and keeps serving',
      )
    }
  }

  /**
   * wake starts (or joins) the one wake of a model. Resolves when the engine is awake and answers
   * /health; rejects with EngineCallError when it does not. A model that is active and not
   * falling asleep resolves at once.
   */
  wake(e: ModelEntry): Promise<void> {
    // A sleep still draining is cancelled: someone wants the model (it then stays active).
    this.draining.get(e)?.abort()
    if (e.wakePromise) return e.wakePromise
    const failure = this.recentWakeFailure(e)
    if (failure) return Promise.reject(new EngineCallError(failure, null))
    if (e.state === 'active' && e.op !== 'sleep') return Promise.resolve()
    if (e.op === 'sleep' || e.state === 'sleeping') e.wakeStartedAt = this.deps.now()
    const p = (async () => {
      try {
        if (e.op === 'sleep') await e.opPromise?.catch(() => {})
        if (e.state !== 'sleeping') return
        await this.runWake(e)
      } finally {
        e.wakePromise = null
      }
    })()
    e.wakePromise = p
    return this.track(p)
  }

  private async runWake(e: ModelEntry): Promise<void> {
    const { log, cfg, lifetime } = this.deps
    e.op = 'wake'
    e.generation++
    e.state = 'waking'
    const t0 = this.deps.now()
    e.wakeStartedAt = t0
    const p = (async () => {
      try {
        await e.backend.wake(e.sleepLevel, cfg.auto_sleep.level as 1 | 2, lifetime)
        const health = await this.awaitHealthy(e, t0 + cfg.control_timeout * 1000)
        if (!health) throw new EngineCallError('engine did not answer /health after waking up', null)
        e.state = 'active'
        e.sleepTime = null
        e.sleepLevel = null
        e.lastWakeMs = this.deps.now() - t0
        e.wakeFailure = null
        log.info('model awake', { model: e.name, ms: e.lastWakeMs })
      } catch (err) {
        e.state = 'sleeping'
        e.wakeFailure = { at: this.deps.now(), message: (err as Error).message }
        throw err
      } finally {
        e.op = null
        e.opPromise = null
      }
    })()
    e.opPromise = p
    await p
  }

  /**
   * awaitHealthy polls the engine's /health after a wake_up until 200, the deadline (epoch ms on
   * the router's clock) or the router stops.
   */
  private async awaitHealthy(e: ModelEntry, deadline: number): Promise<boolean> {
    const { cfg, lifetime, now } = this.deps
    const probe = {
      health: async (timeoutMs = cfg.health_timeout_ms, o: { signal?: AbortSignal } = {}) =>
        (await e.backend.health(timeoutMs, o.signal ?? lifetime)).ok,
    }
    const outcome = await waitHealthy(probe, {
      initialMs: 25,
      maxMs: 1000,
      deadlineMs: deadline - now(),
      probeMs: cfg.health_timeout_ms,
      signal: lifetime,
    })
    return outcome === 'healthy'
  }

  /** recentWakeFailure names the last wake failure while its retry delay lasts, else null. */
  recentWakeFailure(e: ModelEntry): string | null {
    const f = e.wakeFailure
    const ago = f ? this.deps.now() - f.at : 0
    if (!f || ago >= WAKE_RETRY_MS) return null
    return `the last wake failed ${Math.round(ago / 1000)} s ago (${f.message}); retrying after ${WAKE_RETRY_MS / 1000} s`
  }

  /** retryAfterSeconds estimates the rest of a wake from the model's last one (5 s when unknown). */
  retryAfterSeconds(e: ModelEntry): number {
    const expected = e.lastWakeMs ?? 5000
    const elapsed = e.wakeStartedAt ? this.deps.now() - e.wakeStartedAt : 0
    return Math.max(1, Math.ceil((expected - elapsed) / 1000))
  }
}
