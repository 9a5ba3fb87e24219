import { and, asc, count, desc, eq, inArray, sql } from 'drizzle-orm'
import type { BunSQLiteDatabase } from 'drizzle-orm/bun-sqlite'
import { benchmarkRuns, benchmarkScenarios, type RunRow, type ScenarioRow } from './db/schema.ts'
import type { BenchmarkRun, RunStatus, RunSummary, Scenario, ScenarioMetrics } from './schemas.ts'

/**
 * RunRepository maps benchmark runs between their resource shape and the two tables. It is the
 * only code that touches SQL, so the executor and the import path store runs the same way.
 */
export class RunRepository {
  constructor(private readonly db: BunSQLiteDatabase) {}

  insert(run: BenchmarkRun): void {
    this.db.transaction((tx) => {
      tx.insert(benchmarkRuns).values(runValues(run)).run()
      run.scenarios.forEach((s, position) => {
        tx.insert(benchmarkScenarios)
          .values({ ...scenarioValues(s), id: s.id, runId: run.id, position })
          .run()
      })
    })
  }

  saveRun(run: BenchmarkRun): void {
    const { id: _id, ...values } = runValues(run)
    this.db.update(benchmarkRuns).set(values).where(eq(benchmarkRuns.id, run.id)).run()
  }

  saveScenario(s: Scenario): void {
    this.db.update(benchmarkScenarios).set(scenarioValues(s)).where(eq(benchmarkScenarios.id, s.id)).run()
  }

  get(id: string): BenchmarkRun | null {
    const row = this.db.select().from(benchmarkRuns).where(eq(benchmarkRuns.id, id)).get()
    if (!row) return null
    const scenarios = this.db
      .select()
      .from(benchmarkScenarios)
      .where(eq(benchmarkScenarios.runId, id))
      .orderBy(asc(benchmarkScenarios.position))
      .all()
    return { ...toRunFields(row), scenarios: scenarios.map(toScenario) }
  }

  exists(id: string): boolean {
    return (
      this.db.select({ id: benchmarkRuns.id }).from(benchmarkRuns).where(eq(benchmarkRuns.id, id)).get() !==
      undefined
    )
  }

  anyScenarioExists(ids: string[]): boolean {
    if (ids.length === 0) return false
    return (
      this.db
        .select({ id: benchmarkScenarios.id })
        .from(benchmarkScenarios)
        .where(inArray(benchmarkScenarios.id, ids))
        .get() !== undefined
    )
  }

  /** list returns one page of run summaries, newest first (insertion order breaks ties). */
  list(page: number, limit: number, status?: RunStatus): { items: RunSummary[]; total: number } {
    const where = status ? eq(benchmarkRuns.status, status) : undefined
    const total = this.db.select({ n: count() }).from(benchmarkRuns).where(where).get()?.n ?? 0
    const rows = this.db
      .select()
      .from(benchmarkRuns)
      .where(where)
      .orderBy(desc(benchmarkRuns.createdAt), desc(sql`rowid`))
      .limit(limit)
      .offset((page - 1) * limit)
      .all()
    const ids = rows.map((r) => r.id)
    const scenarioRows =
      ids.length === 0
        ? []
        : this.db
            .select({ runId: benchmarkScenarios.runId, modelName: benchmarkScenarios.modelName })
            .from(benchmarkScenarios)
            .where(inArray(benchmarkScenarios.runId, ids))
            .orderBy(asc(benchmarkScenarios.position))
            .all()
    const items = rows.map((r) => {
      const mine = scenarioRows.filter((s) => s.runId === r.id)
      return {
        ...toRunFields(r),
        scenario_count: mine.length,
        model_names: [...new Set(mine.map((s) => s.modelName))],
      }
    })
    return { items, total }
  }

  /** terminalIds lists finished runs (oldest first), the ones an export bundle carries. */
  terminalIds(): string[] {
    return this.db
      .select({ id: benchmarkRuns.id })
      .from(benchmarkRuns)
      .where(inArray(benchmarkRuns.status, ['completed', 'cancelled', 'failed']))
      .orderBy(asc(benchmarkRuns.createdAt))
      .all()
      .map((r) => r.id)
  }

  delete(id: string): boolean {
    return (
      this.db.delete(benchmarkRuns).where(eq(benchmarkRuns.id, id)).returning({ id: benchmarkRuns.id }).all()
        .length > 0
    )
  }

  /**
   * failUnfinished marks runs left pending or running (by a crash or restart) as failed, with
   * their unfinished scenarios; returns the ids it changed.
   */
  failUnfinished(reason: (status: string) => string, at: string): string[] {
    const stale = this.db
      .select({ id: benchmarkRuns.id, status: benchmarkRuns.status })
      .from(benchmarkRuns)
      .where(inArray(benchmarkRuns.status, ['pending', 'running']))
      .all()
    this.db.transaction((tx) => {
      for (const r of stale) {
        const error = reason(r.status)
        tx.update(benchmarkRuns)
          .set({ status: 'failed', error, completedAt: at })
          .where(eq(benchmarkRuns.id, r.id))
          .run()
        tx.update(benchmarkScenarios)
          .set({ status: 'failed', phase: 'done', error, completedAt: at })
          .where(
            and(
              eq(benchmarkScenarios.runId, r.id),
              inArray(benchmarkScenarios.status, ['pending', 'running']),
            ),
          )
          .run()
      }
    })
    return stale.map((r) => r.id)
  }
}

function runValues(run: BenchmarkRun) {
  return {
    id: run.id,
    name: run.name,
    status: run.status,
    mode: run.mode,
    sharedcacheEnabled: run.sharedcache_enabled,
    createdAt: run.created_at,
    startedAt: run.started_at,
    completedAt: run.completed_at,
    totalRequests: run.total_requests,
    successfulRequests: run.successful_requests,
    failedRequests: run.failed_requests,
    durationSeconds: run.duration_seconds,
    error: run.error,
  }
}

function scenarioValues(s: Scenario) {
  return {
    instanceId: s.instance_id,
    routingMode: s.routing_mode,
    modelPath: s.model_path,
    modelName: s.model_name,
    inputTokens: s.input_tokens,
    outputTokens: s.output_tokens,
    concurrency: s.concurrency,
    warmupRequests: s.warmup_requests,
    totalRequests: s.total_requests,
    slaThresholdMs: s.sla_threshold_ms,
    slaTtftMs: s.sla_ttft_ms,
    slaTpotMs: s.sla_tpot_ms,
    requestRate: s.request_rate,
    status: s.status,
    phase: s.phase,
    startedAt: s.started_at,
    completedAt: s.completed_at,
    warmupCompleted: s.warmup_completed,
    completedRequests: s.completed_requests,
    successfulRequests: s.successful_requests,
    failedRequests: s.failed_requests,
    promptTokens: s.prompt_tokens,
    promptSource: s.prompt_source,
    promptNote: s.prompt_note,
    error: s.error,
    metrics: s.metrics ? JSON.stringify(s.metrics) : null,
  }
}

function toRunFields(r: RunRow): Omit<BenchmarkRun, 'scenarios'> {
  return {
    id: r.id,
    name: r.name,
    status: r.status,
    mode: r.mode,
    sharedcache_enabled: r.sharedcacheEnabled,
    created_at: r.createdAt,
    started_at: r.startedAt,
    completed_at: r.completedAt,
    total_requests: r.totalRequests,
    successful_requests: r.successfulRequests,
    failed_requests: r.failedRequests,
    duration_seconds: r.durationSeconds,
    error: r.error,
  }
}

function toScenario(r: ScenarioRow): Scenario {
  const s: Scenario = {
    id: r.id,
    instance_id: r.instanceId,
    routing_mode: r.routingMode === 'proxy' ? 'proxy' : 'direct',
    model_path: r.modelPath,
    model_name: r.modelName,
    input_tokens: r.inputTokens,
    output_tokens: r.outputTokens,
    concurrency: r.concurrency,
    warmup_requests: r.warmupRequests,
    total_requests: r.totalRequests,
    sla_threshold_ms: r.slaThresholdMs,
    sla_ttft_ms: r.slaTtftMs,
    sla_tpot_ms: r.slaTpotMs,
    request_rate: r.requestRate,
    status: r.status,
    phase: r.phase,
    started_at: r.startedAt,
    completed_at: r.completedAt,
    warmup_completed: r.warmupCompleted,
    completed_requests: r.completedRequests,
    successful_requests: r.successfulRequests,
    failed_requests: r.failedRequests,
    prompt_tokens: r.promptTokens,
    prompt_source: r.promptSource === 'tokenize' || r.promptSource === 'estimate' ? r.promptSource : null,
    prompt_note: r.promptNote,
    error: r.error,
  }
  if (r.metrics) s.metrics = JSON.parse(r.metrics) as ScenarioMetrics
  return s
}
