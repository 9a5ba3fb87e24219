import { randomBytes } from 'node:crypto'
import { eq, isNull } from 'drizzle-orm'
import { inferenceKeys } from '../../store/core/schema.ts'
import type { Store } from '../../store/db.ts'
import { InferenceKey, type KeyRecord, type KeySettings } from './key.ts'
import { digestOf, KeyIndex, newSecret } from './secret.ts'

/**
 * KeyBook: the inference keys of this pod: the `inference_keys` table of the data dir's SQLite
 * (what survives a restart and what pods exchange) and, in memory, the live keys by the keyed hash
 * of their secret (KeyIndex), which is all a request's lookup touches; nothing else is kept per key
 * (a host may hold 100,000): a lookup by id reads the table for the digest. A revoked key
 * leaves memory at once and stays in the table as a tombstone, so a late copy of it from another
 * pod can never bring it back (merge: the newer version wins, and a tombstone is never undone).
 */
export type KeyChange = 'created' | 'updated' | 'revoked'

/** LiveRow: what memory keeps of a live key, as the table stores it. */
type LiveRow = Omit<KeySettings, 'models'> & { id: string; digest: string; models: string | null }

export class KeyBook {
  private readonly index = new KeyIndex<InferenceKey>()
  /** Whether any key was ever created here or learnt (a tombstone counts): inference then needs a key. */
  private ever = false
  private store: Store | null = null

  /** attach loads the keys of `store` (the live ones into memory). */
  attach(store: Store): void {
    this.store = store
    const db = store.db
    this.ever = db.select({ id: inferenceKeys.id }).from(inferenceKeys).limit(1).all().length > 0
    // Streamed row by row (no table-sized array at boot: a host may hold 100,000 keys).
    const live = store.sqlite.query<LiveRow, []>(
      'SELECT id, name, digest, models, rpm, tpm, max_concurrent, budget_tokens, budget_period, priority, ' +
        'expires_at FROM inference_keys WHERE revoked_at IS NULL',
    )
    for (const row of live.iterate())
      this.remember({ ...row, models: row.models === null ? null : (JSON.parse(row.models) as string[]) })
  }

  /** everCreated: some key exists or existed (see InferenceKeys.required). */
  get everCreated(): boolean {
    return this.ever
  }

  get size(): number {
    return this.index.size
  }

  /** find: the live key of a presented secret. */
  find(secret: string): InferenceKey | undefined {
    return this.index.find(secret)
  }

  /** get: the live key of this id (its digest read from the table). */
  get(id: string): InferenceKey | undefined {
    const r = this.record(id)
    return r && r.revoked_at === null ? this.index.get(r.digest) : undefined
  }

  /** live: every live key in memory. */
  live(): IterableIterator<InferenceKey> {
    return this.index.values()
  }

  /** record: the stored record of a key (live or revoked), or undefined. */
  record(id: string): KeyRecord | undefined {
    const row = this.db().select().from(inferenceKeys).where(eq(inferenceKeys.id, id)).get()
    return row as KeyRecord | undefined
  }

  /** records: every stored record, tombstones included (what a pod sends another). */
  records(): KeyRecord[] {
    return this.db().select().from(inferenceKeys).all() as KeyRecord[]
  }

  /** page: the live records in creation order, `offset` and `limit` applied (GET /api/keys). */
  page(offset: number, limit: number): KeyRecord[] {
    return this.db()
      .select()
      .from(inferenceKeys)
      .where(isNull(inferenceKeys.revoked_at))
      .orderBy(inferenceKeys.created_at, inferenceKeys.id)
      .limit(limit)
      .offset(offset)
      .all() as KeyRecord[]
  }

  /** create: a new key with `settings`; returns its record and its secret (the only time it exists). */
  create(settings: KeySettings, now = Date.now()): { record: KeyRecord; secret: string } {
    const secret = newSecret()
    const record: KeyRecord = {
      ...settings,
      id: `key_${randomBytes(12).toString('base64url')}`,
      digest: digestOf(secret),
      created_at: now,
      version: now,
      revoked_at: null,
    }
    this.db().insert(inferenceKeys).values(record).run()
    this.remember(record)
    return { record, secret }
  }

  /** update: new settings for a live key (undefined: no such live key). */
  update(id: string, settings: KeySettings, now = Date.now()): KeyRecord | undefined {
    const old = this.record(id)
    if (!old || old.revoked_at !== null) return undefined
    const record: KeyRecord = { ...old, ...settings, version: Math.max(now, old.version + 1) }
    this.db().update(inferenceKeys).set(record).where(eq(inferenceKeys.id, id)).run()
    this.remember(record)
    return record
  }

  /** revoke: a live key is refused from now on (undefined: no such live key). */
  revoke(id: string, now = Date.now()): KeyRecord | undefined {
    const old = this.record(id)
    if (!old || old.revoked_at !== null) return undefined
    const record: KeyRecord = { ...old, revoked_at: now, version: Math.max(now, old.version + 1) }
    this.db().update(inferenceKeys).set(record).where(eq(inferenceKeys.id, id)).run()
    this.forget(old)
    return record
  }

  /**
   * merge takes records from another pod: each one newer than what is here (or new) replaces it, a
   * tombstone here is never undone, and a digest that another key here already has is skipped.
   * Returns what changed, in one transaction.
   */
  merge(records: readonly KeyRecord[]): { record: KeyRecord; change: KeyChange }[] {
    const changed: { record: KeyRecord; change: KeyChange }[] = []
    const store = this.store
    if (!store) return changed
    store.sqlite.transaction(() => {
      for (const r of records) {
        const here = this.record(r.id)
        if (here && (here.revoked_at !== null || here.version >= r.version)) continue
        const clash = this.db().select().from(inferenceKeys).where(eq(inferenceKeys.digest, r.digest)).get()
        if (clash && clash.id !== r.id) continue
        const record: KeyRecord = { ...r }
        if (here) this.db().update(inferenceKeys).set(record).where(eq(inferenceKeys.id, r.id)).run()
        else this.db().insert(inferenceKeys).values(record).run()
        this.ever = true
        if (here && here.digest !== record.digest) this.index.delete(here.digest)
        if (record.revoked_at !== null) this.forget(record)
        else this.remember(record)
        changed.push({
          record,
          change: record.revoked_at !== null ? 'revoked' : here ? 'updated' : 'created',
        })
      }
    })()
    return changed
  }

  /** remember: a live record in memory (a key already there keeps its windows: its settings change). */
  private remember(r: KeySettings & { id: string; digest: string }): void {
    this.ever = true
    this.index.ensure(r.digest, () => new InferenceKey(r.id)).configure(r)
  }

  /** forget: a revoked key leaves memory (requests it holds keep their own reference until they end). */
  private forget(r: KeyRecord): void {
    this.index.delete(r.digest)
  }

  private db() {
    if (!this.store) throw new Error('the key book has no store yet')
    return this.store.db
  }
}
