import { sqliteTable, text } from 'drizzle-orm/sqlite-core'

/**
 * db/schema.ts: the cluster plugin's one table, a small key/value store of what a pod must remember
 * across a restart (the highest term seen, the routing table adopted). It mirrors
 * migrations/0001_cluster_state.sql (test/store/migrations.test.ts fails when they differ).
 */
export const clusterState = sqliteTable('cluster_state', {
  key: text('key').primaryKey().notNull(),
  value: text('value').notNull(),
  updated_at: text('updated_at').notNull(),
})
