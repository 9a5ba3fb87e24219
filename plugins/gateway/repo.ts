import { eq } from 'drizzle-orm'
import type { BunSQLiteDatabase } from 'drizzle-orm/bun-sqlite'
import { gatewayInstances, type InstanceRow } from './db/schema.ts'

/** InstanceRepo persists instance rows; the in-memory registry is the source of truth while running. */
export class InstanceRepo {
  constructor(private readonly db: BunSQLiteDatabase) {}

  all(): InstanceRow[] {
    return this.db.select().from(gatewayInstances).all()
  }

  save(row: InstanceRow): void {
    const value = { ...row, updated_at: new Date().toISOString() }
    this.db
      .insert(gatewayInstances)
      .values(value)
      .onConflictDoUpdate({ target: gatewayInstances.id, set: value })
      .run()
  }

  delete(id: string): void {
    this.db.delete(gatewayInstances).where(eq(gatewayInstances.id, id)).run()
  }
}
