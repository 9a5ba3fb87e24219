import { randomUUID } from 'node:crypto'
import { hostname } from 'node:os'
import { Counter, Gauge } from 'prom-client'
import { abortable } from '../../src/host/abortable.ts'
import { ReplayHub } from '../../src/host/hub.ts'
import { METRIC_PREFIX } from '../../src/host/metrics.ts'
import type { PluginContext } from '../../src/host/plugin.ts'
import { AppError, badRequest, conflict, notFound } from '../../src/http/errors.ts'
import type { GatewayApi } from '../gateway/api.ts'
import type { BenchmarksApi } from './api.ts'
import type { BenchmarksConfig } from './config.ts'
import { type BenchmarkEvent, replay, TERMINAL_EVENTS } from './events.ts'
import { RunExecution, refreshTotals, type StopKind } from './executor.ts'
import { type Bundle, exportBundle, type ImportResult, importBundle } from './export.ts'
import { RunRepository } from './repo.ts'
import type { BenchmarkRun, CreateRun, RunStatus, RunSummary, Scenario } from './schemas.ts'

/**
 * BenchmarkService owns benchmark runs: it validates and stores new runs, queues them (at most
 * `max_concurrent_runs` execute at once), answers reads from the live run while it executes and
 * from the store otherwise, cancels and deletes, and fails runs a restart interrupted.
 */
export const notFoundRun = (id: string) => notFound(`No benchmark with id '${id}'`, 'BENCHMARK_NOT_FOUND')

export class BenchmarkService {
  readonly repo: RunRepository
  /** One event hub per unfinished run; it ends with the run's final event. */
  private readonly hubs = new Map<string, ReplayHub<BenchmarkEvent>>()
  private readonly live = new Map<string, RunExecution>()
  private readonly queue: RunExecution[] = []
  private executing = 0
  private started = false
  private stopping = false
  private readonly runsTotal: Counter<'status'>
  private readonly requestsTotal: Counter<'outcome'>

  constructor(
    private readonly ctx: PluginContext,
    private readonly cfg: BenchmarksConfig,
  ) {
    this.repo = new RunRepository(ctx.store.db)
    const registers = [ctx.metrics]
    this.runsTotal = new Counter({
      name: `${METRIC_PREFIX}benchmark_runs_total`,
      help: 'Benchmark runs finished, by final status',
      labelNames: ['status'],
      registers,
    })
    this.requestsTotal = new Counter({
      name: `${METRIC_PREFIX}benchmark_requests_total`,
      help: 'Measured benchmark requests, by outcome',
      labelNames: ['outcome'],
      registers,
    })
    const self = this
    new Gauge({
      name: `${METRIC_PREFIX}benchmark_runs_active`,
      help: 'Benchmark runs executing or waiting to execute, by status',
      labelNames: ['status'],
      registers,
      collect() {
        this.set({ status: 'running' }, self.executing)
        this.set({ status: 'pending' }, self.queue.length)
      },
    })
  }

  private get gateway(): GatewayApi {
    return this.ctx.api<GatewayApi>('gateway')
  }

  /** recover fails the runs a previous process left pending or running (called at setup). */
  recover(): void {
    const ids = this.repo.failUnfinished(
      (status) =>
        status === 'running'
          ? 'interrupted: modelgate restarted while this run was running'
          : 'interrupted: modelgate restarted before this run started',
      new Date().toISOString(),
    )
    if (ids.length > 0) this.ctx.log.warn('marked interrupted benchmark runs as failed', { runs: ids })
  }

  start(): void {
    this.started = true
    this.pump()
  }

  async stop(deadline: AbortSignal): Promise<void> {
    this.stopping = true
    const message = 'interrupted: modelgate shut down while this run was in progress'
    for (const exec of this.queue.splice(0)) this.finishQueued(exec, 'shutdown', message)
    const running = [...this.live.values()]
    for (const exec of running) exec.stop('shutdown', message)
    // The runs are left to the deadline's owner once it passes (done never rejects).
    await abortable(Promise.all(running.map((e) => e.done)), { signal: deadline }).catch(() => {})
  }

  create(body: CreateRun): BenchmarkRun {
    if (this.stopping) throw new AppError(503, 'SHUTTING_DOWN', 'modelgate is shutting down')
    const free = this.executing < this.cfg.max_concurrent_runs
    if (!free && this.queue.length >= this.cfg.max_queued_runs) {
      throw conflict(
        `${this.queue.length} benchmark runs are already waiting (max_queued_runs ${this.cfg.max_queued_runs})`,
        'BENCHMARK_QUEUE_FULL',
      )
    }
    const createdAt = new Date().toISOString()
    let sharedcache = false
    const scenarios: Scenario[] = body.scenarios.map((sc, i) => {
      const label = `scenarios[${i}] (instance '${sc.instanceId}')`
      const instance = this.gateway.get(sc.instanceId)
      if (!instance) throw badRequest(`${label}: no model instance with this id`)
      if (instance.status !== 'active') {
        throw badRequest(`${label}: the instance is ${instance.status}; benchmarks need an active instance`)
      }
      const sum = sc.inputTokens + sc.outputTokens
      if (instance.max_tokens !== null && sum > instance.max_tokens) {
        throw badRequest(
          `${label}: inputTokens + outputTokens = ${sum} exceeds the model's max_tokens ${instance.max_tokens}`,
        )
      }
      sharedcache ||= instance.sharedcache_enabled
      return {
        id: randomUUID(),
        instance_id: instance.id,
        routing_mode: sc.routingMode ?? 'direct',
        model_path: instance.model_path,
        model_name: instance.model_name,
        input_tokens: sc.inputTokens,
        output_tokens: sc.outputTokens,
        concurrency: sc.concurrency,
        warmup_requests: sc.warmupRequests,
        total_requests: sc.totalRequests,
        sla_threshold_ms: sc.slaThresholdMs ?? null,
        sla_ttft_ms: sc.slaTtftMs ?? null,
        sla_tpot_ms: sc.slaTpotMs ?? null,
        request_rate: sc.requestRate ?? null,
        status: 'pending',
        phase: 'queued',
        started_at: null,
        completed_at: null,
        warmup_completed: 0,
        completed_requests: 0,
        successful_requests: 0,
        failed_requests: 0,
        prompt_tokens: null,
        prompt_source: null,
        prompt_note: null,
        error: null,
      }
    })
    const run: BenchmarkRun = {
      id: randomUUID(),
      name: body.name?.trim() || `Benchmark ${createdAt.slice(0, 19).replace('T', ' ')}`,
      status: 'pending',
      mode: body.mode,
      sharedcache_enabled: sharedcache,
      created_at: createdAt,
      started_at: null,
      completed_at: null,
      total_requests: 0,
      successful_requests: 0,
      failed_requests: 0,
      duration_seconds: null,
      error: null,
      scenarios,
    }
    refreshTotals(run)
    this.repo.insert(run)
    const snapshot = structuredClone(run)
    const exec = new RunExecution(run, {
      gateway: this.gateway,
      mainUrl: () => this.ctx.mainUrl(),
      selfTls: () => this.ctx.selfTls(),
      apiKey: this.ctx.auth.ownInferenceKey() ?? undefined,
      repo: this.repo,
      cfg: this.cfg,
      log: this.ctx.log,
      publish: (id, e) => this.publish(id, e),
      countRequests: (ok, failed) => {
        this.requestsTotal.inc({ outcome: 'success' }, ok)
        this.requestsTotal.inc({ outcome: 'failure' }, failed)
      },
    })
    this.live.set(run.id, exec)
    this.hubs.set(
      run.id,
      this.hub(() => replay(this.snapshot(exec))),
    )
    this.queue.push(exec)
    this.pump()
    return snapshot
  }

  /** hub replays the run's current state (computed by `state`) to a late subscriber. */
  private hub(state: () => BenchmarkEvent[]): ReplayHub<BenchmarkEvent> {
    return new ReplayHub({
      snapshot: state,
      onError: (err) => this.ctx.log.warn('benchmark event subscriber failed', { error: String(err) }),
    })
  }

  private publish(id: string, e: BenchmarkEvent): void {
    const hub = this.hubs.get(id)
    hub?.publish(e)
    if (hub && TERMINAL_EVENTS.has(e.event)) this.endHub(id)
    this.ctx.bus.emit('benchmarks.event', { benchmark_id: id, ...e })
  }

  private pump(): void {
    if (!this.started || this.stopping) return
    while (this.executing < this.cfg.max_concurrent_runs && this.queue.length > 0) {
      const exec = this.queue.shift()!
      this.executing++
      exec.start().finally(() => {
        this.executing--
        this.live.delete(exec.run.id)
        this.runsTotal.inc({ status: exec.run.status })
        this.pump()
      })
    }
  }

  private finishQueued(exec: RunExecution, kind: StopKind, message: string): void {
    exec.stop(kind, message)
    exec.finishUnstarted()
    this.live.delete(exec.run.id)
    this.runsTotal.inc({ status: exec.run.status })
  }

  /** snapshot is a copy of the live run with its counters and elapsed time brought up to date. */
  private snapshot(exec: RunExecution): BenchmarkRun {
    const run = exec.run
    refreshTotals(run)
    const copy = structuredClone(run)
    if (copy.status === 'running' && copy.started_at) {
      copy.duration_seconds = (Date.now() - Date.parse(copy.started_at)) / 1000
    }
    return copy
  }

  get(id: string): BenchmarkRun {
    const exec = this.live.get(id)
    if (exec) return this.snapshot(exec)
    const run = this.repo.get(id)
    if (!run) throw notFoundRun(id)
    return run
  }

  list(page: number, limit: number, status?: RunStatus): { benchmarks: RunSummary[]; total: number } {
    const { items, total } = this.repo.list(page, limit, status)
    const benchmarks = items.map((item) => {
      const exec = this.live.get(item.id)
      if (!exec) return item
      const { scenarios: _s, ...fields } = this.snapshot(exec)
      return { ...item, ...fields }
    })
    return { benchmarks, total }
  }

  async cancel(id: string): Promise<BenchmarkRun> {
    const exec = this.live.get(id)
    if (!exec) {
      const run = this.repo.get(id)
      if (!run) throw notFoundRun(id)
      throw conflict(`benchmark '${id}' is already ${run.status}`, 'BENCHMARK_NOT_ACTIVE')
    }
    await this.halt(exec, 'cancel', 'cancelled by request')
    return this.repo.get(id) ?? exec.run
  }

  async delete(id: string): Promise<{ id: string; deleted: true; cancelled: boolean }> {
    const exec = this.live.get(id)
    if (exec) {
      await this.halt(exec, 'delete', 'cancelled: the run was deleted')
      // A run that did not wind down in time is forgotten all the same: no reads, no late events.
      this.live.delete(id)
      this.endHub(id)
    }
    if (!this.repo.delete(id)) throw notFoundRun(id)
    return { id, deleted: true, cancelled: exec !== undefined }
  }

  private async halt(exec: RunExecution, kind: StopKind, message: string): Promise<void> {
    const queued = this.queue.indexOf(exec)
    if (queued >= 0) {
      this.queue.splice(queued, 1)
      this.finishQueued(exec, kind, message)
      return
    }
    exec.stop(kind, message)
    // A run that does not wind down within 15 s is answered as it is (done never rejects).
    await abortable(exec.done, { timeoutMs: 15_000 }).catch(() => {})
  }

  private endHub(id: string): void {
    this.hubs.get(id)?.end()
    this.hubs.delete(id)
  }

  /**
   * events is the run's event stream: its current state as events, then live events until the
   * run's final event. A finished run's stream has the state only (it has already ended).
   */
  events(id: string): ReplayHub<BenchmarkEvent> {
    const live = this.hubs.get(id)
    if (live) return live
    const run = this.get(id)
    const finished = this.hub(() => replay(run))
    finished.end()
    return finished
  }

  exportBundle(): Bundle {
    return exportBundle(this.repo, this.ctx.version, hostname())
  }

  importBundle(bundle: Bundle): ImportResult {
    return importBundle(this.repo, bundle)
  }

  readonly publicApi: BenchmarksApi = {
    get: (id) => {
      try {
        return this.get(id)
      } catch {
        return null
      }
    },
    existing: (ids) => ids.filter((id) => this.repo.exists(id)),
    exportBundle: () => this.exportBundle(),
    importBundle: (b) => this.importBundle(b),
  }
}
