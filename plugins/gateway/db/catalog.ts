import { integer, real, sqliteTable, text } from 'drizzle-orm/sqlite-core'
import type { EngineKind } from '../../../src/engine/kinds.ts'

/**
 * db/catalog.ts holds the catalogue entries saved through the API (`PUT /api/catalog/{name}`); the
 * entries of the YAML (`plugins.gateway.catalog`) are never written here. It mirrors
 * migrations/0003_catalog.sql and 0005_catalog_engine_kind.sql (test/store/migrations.test.ts fails when they differ). Names compare
 * exactly, as a client's `model` does.
 */
export const gatewayCatalog = sqliteTable('gateway_catalog', {
  name: text('name').primaryKey(),
  /** engine_kind: the engine its load runs; null: the gateway's engine.kind (0005). */
  engine_kind: text('engine_kind').$type<EngineKind>(),
  model_path: text('model_path').notNull(),
  max_tokens: integer('max_tokens'),
  tensor_parallel_size: integer('tensor_parallel_size').notNull(),
  gpu_memory_utilization: real('gpu_memory_utilization'),
  enable_sleep_mode: integer('enable_sleep_mode', { mode: 'boolean' }).notNull(),
  extra_args: text('extra_args', { mode: 'json' }).$type<string[]>().notNull(),
  gpu_ids: text('gpu_ids', { mode: 'json' }).$type<number[]>(),
  pin: integer('pin', { mode: 'boolean' }).notNull(),
  preload: integer('preload', { mode: 'boolean' }).notNull(),
  updated_at: text('updated_at').notNull(),
})

export type CatalogRow = typeof gatewayCatalog.$inferSelect
