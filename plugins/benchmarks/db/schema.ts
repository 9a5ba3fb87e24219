import { index, integer, real, sqliteTable, text } from 'drizzle-orm/sqlite-core'
import type { RoutingMode, RunMode, RunStatus, ScenarioPhase, ScenarioStatus } from '../schemas.ts'

/**
 * Drizzle definitions of the tables created by db/migrations/0001_init.sql (test/store/migrations.test.ts
 * fails when they differ); the value sets of the enum-like text columns come from schemas.ts.
 * Runs survive restarts; scenario metrics are one JSON document per scenario.
 */
export const benchmarkRuns = sqliteTable(
  'benchmark_runs',
  {
    id: text('id').primaryKey(),
    name: text('name').notNull(),
    status: text('status').$type<RunStatus>().notNull(),
    mode: text('mode').$type<RunMode>().notNull(),
    sharedcacheEnabled: integer('sharedcache_enabled', { mode: 'boolean' }).notNull().default(false),
    createdAt: text('created_at').notNull(),
    startedAt: text('started_at'),
    completedAt: text('completed_at'),
    totalRequests: integer('total_requests').notNull().default(0),
    successfulRequests: integer('successful_requests').notNull().default(0),
    failedRequests: integer('failed_requests').notNull().default(0),
    durationSeconds: real('duration_seconds'),
    error: text('error'),
  },
  (t) => [
    index('benchmark_runs_status_idx').on(t.status),
    index('benchmark_runs_created_idx').on(t.createdAt),
  ],
)

export const benchmarkScenarios = sqliteTable(
  'benchmark_scenarios',
  {
    id: text('id').primaryKey(),
    runId: text('run_id')
      .notNull()
      .references(() => benchmarkRuns.id, { onDelete: 'cascade' }),
    position: integer('position').notNull(),
    instanceId: text('instance_id').notNull(),
    routingMode: text('routing_mode').$type<RoutingMode>().notNull(),
    modelPath: text('model_path').notNull(),
    modelName: text('model_name').notNull(),
    inputTokens: integer('input_tokens').notNull(),
    outputTokens: integer('output_tokens').notNull(),
    concurrency: integer('concurrency').notNull(),
    warmupRequests: integer('warmup_requests').notNull(),
    totalRequests: integer('total_requests').notNull(),
    slaThresholdMs: real('sla_threshold_ms'),
    slaTtftMs: real('sla_ttft_ms'),
    slaTpotMs: real('sla_tpot_ms'),
    requestRate: real('request_rate'),
    status: text('status').$type<ScenarioStatus>().notNull(),
    phase: text('phase').$type<ScenarioPhase>().notNull().default('queued'),
    startedAt: text('started_at'),
    completedAt: text('completed_at'),
    warmupCompleted: integer('warmup_completed').notNull().default(0),
    completedRequests: integer('completed_requests').notNull().default(0),
    successfulRequests: integer('successful_requests').notNull().default(0),
    failedRequests: integer('failed_requests').notNull().default(0),
    promptTokens: integer('prompt_tokens'),
    promptSource: text('prompt_source'),
    promptNote: text('prompt_note'),
    error: text('error'),
    metrics: text('metrics'),
  },
  (t) => [index('benchmark_scenarios_run_idx').on(t.runId, t.position)],
)

export type RunRow = typeof benchmarkRuns.$inferSelect
export type ScenarioRow = typeof benchmarkScenarios.$inferSelect
