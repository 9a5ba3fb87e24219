import { sql } from 'drizzle-orm'
import { index, integer, real, sqliteTable, text, uniqueIndex } from 'drizzle-orm/sqlite-core'
import type { Static } from 'elysia'
import type { EngineKind } from '../../../src/engine/kinds.ts'
import type { PresetSourceTypeSchema, ProfileSourceSchema } from '../schemas.ts'

/**
 * db/presets.ts holds the tables of configuration presets (a named set of models to load together)
 * and of memory profiles (what a model measured on a kind of GPU). They mirror
 * migrations/0002_presets_profiles.sql and 0006_preset_engine_kind.sql, indexes and constraints included
 * (test/store/migrations.test.ts fails when they differ).
 */
export const gatewayPresets = sqliteTable(
  'gateway_presets',
  {
    id: text('id').primaryKey(),
    name: text('name').notNull(),
    description: text('description'),
    created_at: text('created_at').notNull(),
    updated_at: text('updated_at').notNull(),
  },
  (t) => [uniqueIndex('gateway_presets_name').on(sql`${t.name} COLLATE NOCASE`)],
)

export const gatewayPresetEntries = sqliteTable(
  'gateway_preset_entries',
  {
    id: text('id').primaryKey(),
    preset_id: text('preset_id')
      .notNull()
      .references(() => gatewayPresets.id, { onDelete: 'cascade' }),
    model_path: text('model_path').notNull(),
    served_model_name: text('served_model_name').notNull(),
    max_tokens: integer('max_tokens'),
    source_type: text('source_type').$type<PresetSourceType>().notNull(),
    gpu_ids: text('gpu_ids', { mode: 'json' }).$type<number[]>().notNull(),
    tensor_parallel_size: integer('tensor_parallel_size').notNull(),
    extra_args: text('extra_args', { mode: 'json' }).$type<string[]>().notNull(),
    enable_sleep_mode: integer('enable_sleep_mode', { mode: 'boolean' }).notNull(),
    gpu_memory_utilization: real('gpu_memory_utilization'),
    load_order: integer('load_order').notNull(),
    /** engine_kind: the engine the model ran; null: saved before 0006 (the gateway's engine.kind). */
    engine_kind: text('engine_kind').$type<EngineKind>(),
  },
  (t) => [index('gateway_preset_entries_preset').on(t.preset_id, t.load_order)],
)

export type PresetRow = typeof gatewayPresets.$inferSelect
export type PresetEntryRow = typeof gatewayPresetEntries.$inferSelect

export type PresetSourceType = Static<typeof PresetSourceTypeSchema>

/** ProfileSource: `auto` recorded at readiness, `instance` saved on request from a running one, `manual` typed in. */
export type ProfileSource = Static<typeof ProfileSourceSchema>

export const gatewayMemoryProfiles = sqliteTable(
  'gateway_memory_profiles',
  {
    id: text('id').primaryKey(),
    profile_name: text('profile_name').notNull(),
    model_path: text('model_path').notNull(),
    max_tokens: integer('max_tokens').notNull(),
    total_gpu_memory_gib: real('total_gpu_memory_gib').notNull(),
    weights_memory_gib: real('weights_memory_gib').notNull(),
    cuda_graphs_gib: real('cuda_graphs_gib').notNull(),
    overhead_memory_gib: real('overhead_memory_gib').notNull(),
    kv_cache_available_gib: real('kv_cache_available_gib').notNull(),
    gpu_name: text('gpu_name').notNull(),
    gpu_total_memory_gib: real('gpu_total_memory_gib').notNull(),
    tensor_parallel_size: integer('tensor_parallel_size').notNull(),
    gpu_memory_utilization: real('gpu_memory_utilization'),
    source: text('source').$type<ProfileSource>().notNull(),
    comments: text('comments'),
    created_at: text('created_at').notNull(),
  },
  (t) => [
    index('gateway_memory_profiles_key').on(
      t.model_path,
      t.gpu_name,
      t.max_tokens,
      t.tensor_parallel_size,
      t.created_at,
    ),
  ],
)

/** MemoryProfile is a stored profile exactly as the API returns it (snake_case, per GPU figures). */
export type MemoryProfile = typeof gatewayMemoryProfiles.$inferSelect
