import { eq } from 'drizzle-orm'
import type { BunSQLiteDatabase } from 'drizzle-orm/bun-sqlite'
import { clusterState } from './db/schema.ts'

/** ClusterStateRepo reads and writes the pod's remembered values (JSON) by key. */
export class ClusterStateRepo {
  constructor(private readonly db: BunSQLiteDatabase) {}

  get<T>(key: string): T | undefined {
    const row = this.db.select().from(clusterState).where(eq(clusterState.key, key)).get()
    if (!row) return undefined
    try {
      return JSON.parse(row.value) as T
    } catch {
      return undefined
    }
  }

  set(key: string, value: unknown): void {
    const row = { key, value: JSON.stringify(value), updated_at: new Date().toISOString() }
    this.db.insert(clusterState).values(row).onConflictDoUpdate({ target: clusterState.key, set: row }).run()
  }
}
