import { and, eq, gte, lt, type SQL, sql } from 'drizzle-orm'
import { inferenceKeys, inferenceKeyUsage } from '../../store/core/schema.ts'
import type { Store } from '../../store/db.ts'

/**
 * UsageBook: requests and the engine's token counts per key, model and UTC hour. A request's end
 * adds to a tally in memory (no I/O, no allocation once its key and model have one this hour); the
 * tallies are written to SQLite in one transaction at most every FLUSH_MS (an upsert that adds),
 * when the hour turns, before every read and at shutdown. So a `kill -9` loses the last FLUSH_MS of
 * counts (more only while the host is too busy to run its timer on time), and nothing else can.
 * Half a second keeps that under the second operators are told, with the time a write takes.
 */
export const FLUSH_MS = 500
const HOUR_MS = 3_600_000
const DAY_MS = 86_400_000

interface Tally {
  requests: number
  prompt: number
  completion: number
  errors: number
}

export type Granularity = 'hour' | 'day'
export type GroupBy = 'key' | 'model'

/**
 * UsageQuery: [from, to) in Unix ms (whole hours), rows per `granularity`, grouped by key or model,
 * one page of them: at most `limit` rows after `after` (rows come ordered by start, then key or model).
 */
export interface UsageQuery {
  from: number
  to: number
  granularity: Granularity
  groupBy: GroupBy
  /** Only this key's rows (a key's own usage, grouped by model). */
  keyId?: string
  limit: number
  /** The last row of the page before (null: the first page). */
  after: UsageCursor | null
}

/** UsageCursor: where a page of usage rows ended: its last row's start (Unix ms) and key id or model. */
export interface UsageCursor {
  start: number
  group: string
}

/** UsagePage: one page of rows; `next`: where the next begins (null: this was the last). */
export interface UsagePage {
  rows: UsageRow[]
  next: UsageCursor | null
}

export interface UsageRow {
  /** Start of the hour or day (ISO 8601). */
  start: string
  key_id?: string
  key_name?: string
  model?: string
  requests: number
  prompt_tokens: number
  completion_tokens: number
  errors: number
}

/** STATIC_KEY_ID: the usage of the static INFERENCE_API_KEY is kept under this id (and name). */
export const STATIC_KEY_ID = 'static'

export class UsageBook {
  /** Tallies not written yet: key id → model → counts, all of hour `hour`. */
  private pending = new Map<string, Map<string, Tally>>()
  private hour = 0
  private store: Store | null = null
  private timer: Timer | null = null

  /** attach: tallies go to `store`, every FLUSH_MS; a write that fails is kept for the next (`failed` is told). */
  attach(store: Store, failed: (err: unknown) => void): void {
    this.store = store
    this.timer = setInterval(() => {
      try {
        this.flush()
      } catch (err) {
        failed(err)
      }
    }, FLUSH_MS)
    this.timer.unref()
  }

  /** stop writes what is pending and stops the timer (the store is about to close). */
  stop(): void {
    if (this.timer) clearInterval(this.timer)
    this.timer = null
    this.flush()
  }

  /** add: one request of `keyId` for `model` ended at `now`. */
  add(keyId: string, model: string, now: number, error: boolean, prompt: number, completion: number): void {
    const hour = now - (now % HOUR_MS)
    if (hour !== this.hour) {
      try {
        this.flush()
      } catch {
        // The disk refused (the timer reports it): the last hour's counts go with the new hour's.
      }
      this.hour = hour
    }
    let models = this.pending.get(keyId)
    if (!models) {
      models = new Map()
      this.pending.set(keyId, models)
    }
    let t = models.get(model)
    if (!t) {
      t = { requests: 0, prompt: 0, completion: 0, errors: 0 }
      models.set(model, t)
    }
    t.requests++
    t.prompt += prompt
    t.completion += completion
    if (error) t.errors++
  }

  /** flush writes the pending tallies in one transaction. */
  flush(): void {
    const store = this.store
    if (!store || this.pending.size === 0) return
    const pending = this.pending
    const hour = this.hour
    const u = inferenceKeyUsage
    store.sqlite.transaction(() => {
      for (const [keyId, models] of pending)
        for (const [model, t] of models)
          store.db
            .insert(u)
            .values({
              key_id: keyId,
              model,
              hour,
              requests: t.requests,
              prompt_tokens: t.prompt,
              completion_tokens: t.completion,
              errors: t.errors,
            })
            .onConflictDoUpdate({
              target: [u.key_id, u.model, u.hour],
              set: {
                requests: sql`${u.requests} + excluded.requests`,
                prompt_tokens: sql`${u.prompt_tokens} + excluded.prompt_tokens`,
                completion_tokens: sql`${u.completion_tokens} + excluded.completion_tokens`,
                errors: sql`${u.errors} + excluded.errors`,
              },
            })
            .run()
    })()
    // Written: only now are the tallies dropped (a failed write keeps them for the next flush).
    if (this.pending === pending) this.pending = new Map()
  }

  /** tokensSince: a key's prompt and completion tokens from `since` (an hour's start) on. */
  tokensSince(keyId: string, since: number): number {
    this.flush()
    const u = inferenceKeyUsage
    const row = this.db()
      .select({ n: sql<number>`coalesce(sum(${u.prompt_tokens} + ${u.completion_tokens}), 0)` })
      .from(u)
      .where(and(eq(u.key_id, keyId), gte(u.hour, since)))
      .get()
    return row?.n ?? 0
  }

  /** rows: a page of the usage of [from, to) per hour or day and per key or model (see UsageQuery). */
  rows(q: UsageQuery): UsagePage {
    this.flush()
    const u = inferenceKeyUsage
    const size = q.granularity === 'day' ? DAY_MS : HOUR_MS
    const start = sql<number>`(${u.hour} / ${size}) * ${size}`
    const group = q.groupBy === 'model' ? u.model : u.key_id
    const after = q.after
    // Keyset paging: a page starts past the last row of the one before, however the table grew.
    const where = and(
      gte(u.hour, q.from),
      lt(u.hour, q.to),
      q.keyId ? eq(u.key_id, q.keyId) : undefined,
      after
        ? sql`(${start} > ${after.start} OR (${start} = ${after.start} AND ${group} > ${after.group}))`
        : undefined,
    )
    const rows = this.grouped(q, start, where)
    if (rows.length <= q.limit) return { rows, next: null }
    rows.length = q.limit
    const last = rows[rows.length - 1]!
    return {
      rows,
      next: {
        start: Date.parse(last.start),
        group: (q.groupBy === 'model' ? last.model : last.key_id) ?? '',
      },
    }
  }

  /** grouped: up to limit + 1 rows of a query (one more than a page: whether another page follows). */
  private grouped(q: UsageQuery, start: SQL<number>, where: SQL | undefined): UsageRow[] {
    const u = inferenceKeyUsage
    const sums = {
      start,
      requests: sql<number>`sum(${u.requests})`,
      prompt_tokens: sql<number>`sum(${u.prompt_tokens})`,
      completion_tokens: sql<number>`sum(${u.completion_tokens})`,
      errors: sql<number>`sum(${u.errors})`,
    }
    const out = (r: { start: number }) => new Date(r.start).toISOString()
    if (q.groupBy === 'model') {
      return this.db()
        .select({ ...sums, model: u.model })
        .from(u)
        .where(where)
        .groupBy(start, u.model)
        .orderBy(start, u.model)
        .limit(q.limit + 1)
        .all()
        .map((r) => ({ ...r, start: out(r) }))
    }
    return this.db()
      .select({ ...sums, key_id: u.key_id, key_name: inferenceKeys.name })
      .from(u)
      .leftJoin(inferenceKeys, eq(inferenceKeys.id, u.key_id))
      .where(where)
      .groupBy(start, u.key_id)
      .orderBy(start, u.key_id)
      .limit(q.limit + 1)
      .all()
      .map((r) => ({
        ...r,
        start: out(r),
        key_name: r.key_name ?? (r.key_id === STATIC_KEY_ID ? STATIC_KEY_ID : r.key_id),
      }))
  }

  private db() {
    if (!this.store) throw new Error('the usage book has no store yet')
    return this.store.db
  }
}
