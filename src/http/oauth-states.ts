import { asc, count, inArray, lte } from 'drizzle-orm'
import type { BunSQLiteDatabase } from 'drizzle-orm/bun-sqlite'
import { oauthUsedStates } from '../store/core/schema.ts'

/**
 * UsedStates: the OAuth login states already presented to the callback, in the store (SQLite), so
 * a callback URL replayed with its cookie is refused even after a restart on the same data dir. A
 * state is kept until the login it belongs to would have expired anyway (its cookie's expiry);
 * expired rows are purged each time a state is consumed. At most `limit` are kept: beyond it the
 * soonest to expire are dropped, so a flood of minted login cookies cannot fill the disk.
 */
export class UsedStates {
  constructor(
    private readonly db: BunSQLiteDatabase,
    private readonly limit = 100_000,
  ) {}

  /** consume marks `state` used until `expiresAt` (Unix ms); false when it was used before. */
  consume(state: string, expiresAt: number, now: number): boolean {
    return this.db.transaction((tx) => {
      tx.delete(oauthUsedStates).where(lte(oauthUsedStates.expires_at, now)).run()
      const inserted = tx
        .insert(oauthUsedStates)
        .values({ state, expires_at: expiresAt })
        .onConflictDoNothing()
        .returning({ state: oauthUsedStates.state })
        .all()
      if (inserted.length === 0) return false
      const kept = tx.select({ n: count() }).from(oauthUsedStates).get()?.n ?? 0
      if (kept > this.limit) {
        const oldest = tx
          .select({ state: oauthUsedStates.state })
          .from(oauthUsedStates)
          .orderBy(asc(oauthUsedStates.expires_at))
          .limit(kept - this.limit)
        tx.delete(oauthUsedStates).where(inArray(oauthUsedStates.state, oldest)).run()
      }
      return true
    })
  }

  /** size: how many states are kept (for tests and diagnostics). */
  size(): number {
    return this.db.select({ n: count() }).from(oauthUsedStates).get()?.n ?? 0
  }
}
