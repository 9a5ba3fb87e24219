import { Database } from 'bun:sqlite'
import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { type BunSQLiteDatabase, drizzle } from 'drizzle-orm/bun-sqlite'

/**
 * Store is the SQLite file in `data_dir`, opened in WAL mode and shared by every plugin through
 * drizzle. Each plugin owns its tables and ships its migrations as SQL text imported at build
 * time (so they live inside the compiled binary; drizzle's folder migrator cannot read them there).
 */
export interface Migration {
  /** id orders migrations within their owner, e.g. '0001_init'. */
  id: string
  sql: string
}

export interface Store {
  readonly sqlite: Database
  readonly db: BunSQLiteDatabase
  readonly path: string
  close(): void
}

export function openStore(dataDir: string, fileName = 'modelgate.db'): Store {
  mkdirSync(dataDir, { recursive: true })
  const path = join(dataDir, fileName)
  const sqlite = new Database(path, { create: true, strict: true })
  sqlite.exec('PRAGMA journal_mode = WAL')
  sqlite.exec('PRAGMA synchronous = NORMAL')
  sqlite.exec('PRAGMA foreign_keys = ON')
  sqlite.exec('PRAGMA busy_timeout = 5000')
  const db = drizzle({ client: sqlite })
  let closed = false
  return {
    sqlite,
    db,
    path,
    close() {
      if (closed) return
      closed = true
      sqlite.close()
    },
  }
}

/** applyMigrations runs each owner's not-yet-applied migrations in order, each in a transaction. */
export function applyMigrations(store: Store, owner: string, migrations: readonly Migration[]): string[] {
  const { sqlite } = store
  sqlite.exec(`CREATE TABLE IF NOT EXISTS _migrations (
    owner TEXT NOT NULL, id TEXT NOT NULL, applied_at TEXT NOT NULL, PRIMARY KEY (owner, id))`)
  const applied = new Set(
    sqlite
      .query<{ id: string }, [string]>('SELECT id FROM _migrations WHERE owner = ?')
      .all(owner)
      .map((r) => r.id),
  )
  const ran: string[] = []
  for (const m of [...migrations].sort((a, b) => a.id.localeCompare(b.id))) {
    if (applied.has(m.id)) continue
    sqlite.transaction(() => {
      sqlite.exec(m.sql)
      sqlite
        .query('INSERT INTO _migrations (owner, id, applied_at) VALUES (?, ?, ?)')
        .run(owner, m.id, new Date().toISOString())
    })()
    ran.push(m.id)
  }
  return ran
}
