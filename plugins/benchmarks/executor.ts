import type { Logger } from '../../src/host/logger.ts'
import type { SelfTrust } from '../../src/host/plugin.ts'
import type { GatewayApi, InstanceRecord } from '../gateway/api.ts'
import type { BenchmarksConfig } from './config.ts'
import {
  type BenchmarkEvent,
  progressEvent,
  runEndEvent,
  scenarioEndEvent,
  scenarioStartedEvent,
  startedEvent,
  warmupEvent,
} from './events.ts'
import { HttpStreamClient } from './http-stream.ts'
import { buildPrompts } from './prompts.ts'
import type { RunRepository } from './repo.ts'
import { type LoadPlan, runScenarioLoad } from './runner.ts'
import type { BenchmarkRun, Scenario, ScenarioMetrics } from './schemas.ts'
import { ScenarioRecorder } from './statistics.ts'

/**
 * RunExecution carries one benchmark run from pending to a final status: it runs the scenarios
 * (one after another when isolated; all at once when in contention, with their measured phases
 * released together after every warmup), keeps the live run resource current, stores it at each
 * step and publishes the stream events. Cancellation aborts every in-flight request.
 */
export interface ExecutorDeps {
  gateway: GatewayApi
  mainUrl(): string
  /** selfTls: how to verify the main listener when it speaks https (server.tls), else null. */
  selfTls(): SelfTrust | null
  apiKey: string | undefined
  repo: RunRepository
  cfg: BenchmarksConfig
  log: Logger
  publish(runId: string, e: BenchmarkEvent): void
  countRequests(ok: number, failed: number): void
}

export type StopKind = 'cancel' | 'delete' | 'shutdown'

class ScenarioError extends Error {}

const nowIso = () => new Date().toISOString()

/** refreshTotals recomputes the run's request counters from its scenarios. */
export function refreshTotals(run: BenchmarkRun): void {
  run.total_requests = run.scenarios.reduce((n, s) => n + s.total_requests, 0)
  run.successful_requests = run.scenarios.reduce((n, s) => n + s.successful_requests, 0)
  run.failed_requests = run.scenarios.reduce((n, s) => n + s.failed_requests, 0)
}

/** allFailed: why a scenario none of whose measured requests succeeded failed, e.g.
 * `all 20 measured requests failed (401 × 20): HTTP 401: invalid_api_key: Invalid API key`. */
export function allFailed(m: ScenarioMetrics): string {
  const causes = Object.entries(m.failed_by_status ?? {})
    .map(([status, n]) => `${status} × ${n}`)
    .join(', ')
  const first = m.first_errors?.[0] ?? m.errors[0]?.message
  return `all ${m.total_requests} measured requests failed${causes ? ` (${causes})` : ''}${first ? `: ${first}` : ''}`
}

/** Barrier releases the contention scenarios' measured phases together. */
class Barrier {
  private left: number
  private readonly released: Promise<void>
  private release!: () => void

  constructor(parties: number, signal: AbortSignal) {
    this.left = parties
    this.released = new Promise((r) => {
      this.release = r
    })
    signal.addEventListener('abort', () => this.release(), { once: true })
  }

  arrive(): Promise<void> {
    this.leave()
    return this.released
  }

  leave(): void {
    if (--this.left <= 0) this.release()
  }
}

export class RunExecution {
  private readonly controller = new AbortController()
  private stopKind: StopKind | null = null
  private stopMessage = ''
  private finished!: Promise<void>

  constructor(
    readonly run: BenchmarkRun,
    private readonly deps: ExecutorDeps,
  ) {}

  get done(): Promise<void> {
    return this.finished ?? Promise.resolve()
  }

  /** stop aborts the run; `shutdown` ends it as failed, the others as cancelled. */
  stop(kind: StopKind, message: string): void {
    if (this.stopKind) return
    this.stopKind = kind
    this.stopMessage = message
    this.controller.abort(new Error(message))
  }

  /** start runs the whole execution; the returned promise never rejects. */
  start(): Promise<void> {
    this.finished = this.execute().catch((err) => {
      this.deps.log.error('benchmark run crashed', { id: this.run.id, error: String(err) })
    })
    return this.finished
  }

  /** finishUnstarted ends a run that never left the queue. */
  finishUnstarted(): void {
    this.finalize()
  }

  private emit(e: BenchmarkEvent): void {
    this.deps.publish(this.run.id, e)
  }

  private async execute(): Promise<void> {
    const { run } = this
    if (this.controller.signal.aborted) return this.finalize()
    run.status = 'running'
    run.started_at = nowIso()
    this.deps.repo.saveRun(run)
    this.emit(startedEvent(run))
    // Proxy-mode scenarios call this process's main listener: with TLS on, its own certificate is trusted.
    const client = new HttpStreamClient(this.deps.selfTls() ?? {})
    try {
      if (run.mode === 'isolated') {
        for (const s of run.scenarios) {
          if (this.controller.signal.aborted) break
          await this.scenario(s, client, null)
        }
      } else {
        const barrier = new Barrier(run.scenarios.length, this.controller.signal)
        await Promise.all(run.scenarios.map((s) => this.scenario(s, client, barrier)))
      }
    } finally {
      client.close()
      this.finalize()
    }
  }

  private finalize(): void {
    const { run } = this
    const at = nowIso()
    const aborted = this.stopKind !== null
    for (const s of run.scenarios) {
      if (s.status !== 'pending' && s.status !== 'running') continue
      s.status = this.stopKind === 'shutdown' ? 'failed' : 'cancelled'
      s.phase = 'done'
      s.error = aborted ? this.stopMessage : 'the run ended before this scenario started'
      s.completed_at = at
      this.deps.repo.saveScenario(s)
    }
    refreshTotals(run)
    run.completed_at = at
    run.duration_seconds = run.started_at ? (Date.parse(at) - Date.parse(run.started_at)) / 1000 : 0
    const failed = run.scenarios.filter((s) => s.status === 'failed')
    if (this.stopKind === 'shutdown') {
      run.status = 'failed'
      run.error = this.stopMessage
    } else if (aborted) {
      run.status = 'cancelled'
      run.error = this.stopMessage
    } else if (failed.length > 0) {
      run.status = 'failed'
      run.error = failed
        .map((s) => `scenario ${run.scenarios.indexOf(s) + 1} (instance '${s.instance_id}'): ${s.error}`)
        .join('; ')
    } else run.status = 'completed'
    this.deps.repo.saveRun(run)
    const end = runEndEvent(run)
    if (end) this.emit(end)
  }

  private async scenario(s: Scenario, client: HttpStreamClient, barrier: Barrier | null): Promise<void> {
    const { run, deps } = this
    const signal = this.controller.signal
    if (signal.aborted) return barrier?.leave()
    let waited = false
    s.status = 'running'
    s.phase = 'preparing'
    s.started_at = nowIso()
    deps.repo.saveScenario(s)
    this.emit(scenarioStartedEvent(run, s))
    try {
      const plan = await this.prepare(s, signal)
      const recorder = new ScenarioRecorder({
        e2eMs: s.sla_threshold_ms,
        ttftMs: s.sla_ttft_ms,
        tpotMs: s.sla_tpot_ms,
      })
      const throttle = deps.cfg.progress_interval_ms
      let lastWarm = 0
      let lastProgress = 0
      // 'measuring' is set by the measuring hook, once the measured phase has really begun.
      if (s.warmup_requests > 0) s.phase = 'warmup'
      let measured = false
      const outcome = await runScenarioLoad(client, plan, recorder, signal, {
        warmup: (completed) => {
          s.warmup_completed = completed
          const now = performance.now()
          if (completed === s.warmup_requests || now - lastWarm >= throttle) {
            lastWarm = now
            this.emit(warmupEvent(run, s))
          }
        },
        beforeMeasure: async () => {
          if (!barrier) return
          waited = true
          await barrier.arrive()
        },
        measuring: () => {
          measured = true
          s.phase = 'measuring'
          deps.repo.saveScenario(s)
          this.emit(progressEvent(run, s))
          lastProgress = performance.now()
        },
        progress: (completed) => {
          s.completed_requests = completed
          s.successful_requests = recorder.successCount
          s.failed_requests = recorder.errorCount
          const now = performance.now()
          if (completed === s.total_requests || now - lastProgress >= throttle) {
            lastProgress = now
            this.emit(progressEvent(run, s))
          }
        },
      })
      // a scenario cancelled before its measured phase has no metrics
      if (!outcome.cancelled || measured) {
        const m = recorder.summarize(outcome.durationSec)
        s.metrics = m
        s.completed_requests = m.total_requests
        s.successful_requests = m.successful_requests
        s.failed_requests = m.failed_requests
        deps.countRequests(m.successful_requests, m.failed_requests)
      }
      if (outcome.cancelled) {
        s.status = this.stopKind === 'shutdown' ? 'failed' : 'cancelled'
        s.error = this.stopMessage
      } else if (s.metrics && s.metrics.total_requests > 0 && s.metrics.successful_requests === 0) {
        // nothing was measured: a scenario none of whose requests succeeded failed, and says why
        s.status = 'failed'
        s.error = allFailed(s.metrics)
      } else s.status = 'completed'
    } catch (err) {
      s.status = signal.aborted ? (this.stopKind === 'shutdown' ? 'failed' : 'cancelled') : 'failed'
      s.error = signal.aborted ? this.stopMessage : err instanceof Error ? err.message : String(err)
      if (!(err instanceof ScenarioError) && !signal.aborted) {
        deps.log.warn('benchmark scenario failed', { run: run.id, scenario: s.id, error: s.error })
      }
    } finally {
      if (barrier && !waited) barrier.leave()
    }
    s.phase = 'done'
    s.completed_at = nowIso()
    deps.repo.saveScenario(s)
    refreshTotals(run)
    const end = scenarioEndEvent(run, s)
    if (end) this.emit(end)
  }

  /** prepare checks the instance again, builds the prompts and the request plan. */
  private async prepare(s: Scenario, signal: AbortSignal): Promise<LoadPlan> {
    const { gateway, cfg } = this.deps
    const instance: InstanceRecord | undefined = gateway.get(s.instance_id)
    if (!instance) throw new ScenarioError(`instance '${s.instance_id}' no longer exists`)
    if (instance.status !== 'active') {
      throw new ScenarioError(`instance '${s.instance_id}' is ${instance.status}, not active`)
    }
    const engineUrl = gateway.engineBaseUrl(instance).replace(/\/+$/, '')
    const servedName = instance.served_model_name || instance.model_path
    const prompts = await buildPrompts({
      engineUrl,
      engineKind: instance.engine_kind,
      model: servedName,
      target: s.input_tokens,
      signal,
      timeoutMs: cfg.tokenize_timeout_ms,
    })
    s.prompt_tokens = prompts.tokens
    s.prompt_source = prompts.source
    s.prompt_note = prompts.note
    const limit = prompts.maxModelLen ?? instance.max_tokens
    if (limit !== null && prompts.tokens + s.output_tokens > limit) {
      throw new ScenarioError(
        `inputTokens + outputTokens = ${prompts.tokens + s.output_tokens} exceeds the model's max_tokens ${limit}`,
      )
    }
    const direct = s.routing_mode === 'direct'
    const url = new URL('/v1/completions', direct ? engineUrl : this.deps.mainUrl())
    const headers: Record<string, string> = {}
    if (!direct && this.deps.apiKey) headers.authorization = `Bearer ${this.deps.apiKey}`
    const prefix = `{"model":${JSON.stringify(direct ? servedName : instance.id)},"prompt":`
    const suffix =
      `,"max_tokens":${s.output_tokens},"ignore_eos":true,"temperature":0,"stream":true,` +
      `"stream_options":{"include_usage":true}}`
    return {
      url,
      headers,
      // warmup requests (i < 0) get prompt variants after the measured ones
      body: (i) => prefix + JSON.stringify(prompts.prompt(i < 0 ? s.total_requests - 1 - i : i)) + suffix,
      requestIdPrefix: `bench-${s.id.slice(0, 8)}`,
      concurrency: s.concurrency,
      warmupRequests: s.warmup_requests,
      totalRequests: s.total_requests,
      requestRate: s.request_rate,
      requestTimeoutMs: cfg.request_timeout_ms,
    }
  }
}
