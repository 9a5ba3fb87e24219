import { index, integer, real, sqliteTable, text } from 'drizzle-orm/sqlite-core'
import type { EngineKind } from '../../../src/engine/kinds.ts'
import type { InstanceStatus, MemoryMetrics, SleepLevel } from '../api.ts'

/**
 * gatewayInstances records every engine the gateway launched, with what is needed to find it again
 * after a restart (pid, process group, start time, port, GPUs, launch command) and which engine it
 * runs (`engine_kind`, 0004: rows older than it ran vLLM). It mirrors db/migrations/0001_instances.sql,
 * 0003_catalog.sql and 0004_engine_kind.sql (test/store/migrations.test.ts fails when they differ); the API's
 * instance record (schemas.ts) is a view of it: `pid` as `process_id`, without the recovery columns.
 */
export const gatewayInstances = sqliteTable(
  'gateway_instances',
  {
    id: text('id').primaryKey(),
    model_path: text('model_path').notNull(),
    model_name: text('model_name').notNull(),
    served_model_name: text('served_model_name').notNull(),
    status: text('status').$type<InstanceStatus>().notNull(),
    port: integer('port').notNull(),
    pid: integer('pid'),
    pgid: integer('pgid'),
    process_start_time: text('process_start_time'),
    max_tokens: integer('max_tokens'),
    requested_max_tokens: integer('requested_max_tokens'),
    gpu_memory_utilization: real('gpu_memory_utilization').notNull(),
    gpu_ids: text('gpu_ids', { mode: 'json' }).$type<number[]>().notNull(),
    tensor_parallel_size: integer('tensor_parallel_size').notNull(),
    sharedcache_enabled: integer('sharedcache_enabled', { mode: 'boolean' }).notNull(),
    enable_sleep_mode: integer('enable_sleep_mode', { mode: 'boolean' }).notNull(),
    sleep_level: integer('sleep_level').$type<SleepLevel>(),
    slept_at: text('slept_at'),
    extra_args: text('extra_args', { mode: 'json' }).$type<string[]>().notNull(),
    launch_argv: text('launch_argv', { mode: 'json' }).$type<string[]>().notNull(),
    launch_command: text('launch_command').notNull(),
    log_dir: text('log_dir').notNull(),
    loaded_at: text('loaded_at').notNull(),
    ready_at: text('ready_at'),
    error: text('error'),
    memory_metrics: text('memory_metrics', { mode: 'json' }).$type<MemoryMetrics>(),
    memory_baseline_by_gpu: text('memory_baseline_by_gpu', { mode: 'json' }).$type<Record<string, number>>(),
    updated_at: text('updated_at').notNull(),
    /** evictable: the load asked that the residency manager may unload or sleep it for another model (0003). */
    evictable: integer('evictable', { mode: 'boolean' }).notNull().default(false),
    engine_kind: text('engine_kind').$type<EngineKind>().notNull().default('vllm'),
  },
  (t) => [index('gateway_instances_status').on(t.status)],
)

export type InstanceRow = typeof gatewayInstances.$inferSelect
