import type { Database } from 'bun:sqlite'
import { afterAll, describe, expect, it } from 'bun:test'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { is, SQL } from 'drizzle-orm'
import {
  type AnySQLiteColumn,
  getTableConfig,
  index,
  integer,
  SQLiteSyncDialect,
  SQLiteTable,
  sqliteTable,
  text,
} from 'drizzle-orm/sqlite-core'
import { plugins } from '../../plugins/index.ts'
import { orderPlugins } from '../../src/host/registry.ts'
import { CORE_OWNER, coreMigrations } from '../../src/store/core/migrations.ts'
import { applyMigrations, type Migration, openStore, type Store } from '../../src/store/db.ts'

/**
 * Each plugin declares its tables twice: as SQL migrations (what a database file really gets,
 * embedded in the binary) and as drizzle tables (what the code reads and writes). This test applies
 * every plugin's migrations, as the host does at boot (same plugin list, same order, same runner), to
 * a fresh SQLite file and compares what SQLite reports (PRAGMA table_info, index_list, index_xinfo,
 * foreign_key_list) with the drizzle definitions in the plugin's `db/*.ts` modules: the tables;
 * per column its name, type affinity, NOT NULL, primary key and default; indexes (name, unique,
 * columns with collation and order, partial or not); UNIQUE constraints; foreign keys with their
 * actions. Not compared: CHECK constraints (neither side declares any) and the text of a partial
 * index's WHERE or of an index expression other than `column [COLLATE x] [ASC|DESC]`.
 *
 * A single-column primary key counts as NOT NULL on the SQLite side too: drizzle's `primaryKey()`
 * implies it, and `id TEXT PRIMARY KEY` without it (benchmarks' 0001_init) only differs for rows
 * written around drizzle, whose insert type requires the key.
 */

const dialect = new SQLiteSyncDialect()

type Affinity = 'INTEGER' | 'TEXT' | 'BLOB' | 'REAL' | 'NUMERIC'

/** affinity: SQLite's rules for a declared column type (https://sqlite.org/datatype3.html §3.1). */
function affinity(declared: string): Affinity {
  const t = declared.toUpperCase()
  if (t.includes('INT')) return 'INTEGER'
  if (t.includes('CHAR') || t.includes('CLOB') || t.includes('TEXT')) return 'TEXT'
  if (t === '' || t.includes('BLOB')) return 'BLOB'
  if (t.includes('REAL') || t.includes('FLOA') || t.includes('DOUB')) return 'REAL'
  return 'NUMERIC'
}

/** literal renders a value as an SQL literal, the way a DEFAULT clause writes it. */
function literal(v: unknown): string {
  if (v === null) return 'NULL'
  if (typeof v === 'number' || typeof v === 'bigint') return String(v)
  if (typeof v === 'boolean') return v ? '1' : '0'
  return `'${String(v).replaceAll("'", "''")}'`
}

/** normalDefault makes two spellings of one default compare equal: (0), 0.0, FALSE; 'x'. */
function normalDefault(sql: string | null): string | null {
  if (sql === null) return null
  let s = sql.trim()
  while (s.startsWith('(') && s.endsWith(')')) s = s.slice(1, -1).trim()
  const upper = s.toUpperCase()
  if (upper === 'TRUE') return '1'
  if (upper === 'FALSE') return '0'
  if (upper === 'NULL') return 'NULL'
  if (/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(s)) return String(Number(s))
  return s.replace(/\s+/g, ' ')
}

/** The default drizzle puts in the table: a value mapped to the driver, or SQL; not $defaultFn. */
function drizzleDefault(col: AnySQLiteColumn): string | null {
  if (col.default === undefined) return null
  if (is(col.default, SQL)) return dialect.sqlToQuery(col.default).sql
  return literal(col.mapToDriverValue(col.default))
}

/** indexPart renders one indexed column or expression as `name [COLLATE X] [DESC]`. */
function indexPart(part: AnySQLiteColumn | SQL, table: string): string {
  if (!is(part, SQL)) return part.name
  const text = dialect.sqlToQuery(part).sql.replaceAll(`"${table}".`, '').replace(/\s+/g, ' ').trim()
  const m = /^"?(\w+)"?(?: collate (\w+))?(?: (asc|desc))?$/i.exec(text)
  if (!m) return '<expression>'
  const [, name, coll, order] = m
  return `${name}${coll && coll.toUpperCase() !== 'BINARY' ? ` COLLATE ${coll.toUpperCase()}` : ''}${order?.toUpperCase() === 'DESC' ? ' DESC' : ''}`
}

interface ColumnInfo {
  name: string
  type: string
  notnull: number
  dflt_value: string | null
  pk: number
}
interface IndexInfo {
  name: string
  unique: number
  origin: 'c' | 'u' | 'pk'
  partial: number
}
interface IndexColumnInfo {
  cid: number
  name: string | null
  desc: number
  coll: string
  key: number
}
interface ForeignKeyInfo {
  id: number
  table: string
  from: string
  to: string | null
  on_update: string
  on_delete: string
}

function pragma<T>(db: Database, what: string, arg: string): T[] {
  return db.query<T, []>(`PRAGMA ${what}("${arg.replaceAll('"', '""')}")`).all()
}

function sqliteIndexColumns(db: Database, idx: string): string {
  return pragma<IndexColumnInfo>(db, 'index_xinfo', idx)
    .filter((c) => c.key === 1)
    .map((c) => {
      if (c.cid === -2 || c.name === null) return '<expression>'
      const coll = c.coll.toUpperCase() === 'BINARY' ? '' : ` COLLATE ${c.coll.toUpperCase()}`
      return `${c.name}${coll}${c.desc ? ' DESC' : ''}`
    })
    .join(', ')
}

const fkText = (from: string[], table: string, to: string[], onUpdate: string, onDelete: string) =>
  `(${from.join(', ')}) REFERENCES ${table} (${to.join(', ')}) ON UPDATE ${onUpdate.toUpperCase()} ON DELETE ${onDelete.toUpperCase()}`

/**
 * drift lists every difference between the table SQLite holds and its drizzle definition, each
 * naming the table (and the column or index) and both sides. Empty when they agree.
 */
function drift(db: Database, table: SQLiteTable): string[] {
  const cfg = getTableConfig(table)
  const t = cfg.name
  const out: string[] = []
  const sqlCols = pragma<ColumnInfo>(db, 'table_info', t)
  if (sqlCols.length === 0) return [`${t}: declared in drizzle, but no migration creates it`]

  // Columns.
  const composite = cfg.primaryKeys.flatMap((pk) => pk.columns.map((c) => c.name))
  const drizzlePk = [...cfg.columns.filter((c) => c.primary).map((c) => c.name), ...composite]
  const sqlPk = sqlCols
    .filter((c) => c.pk > 0)
    .sort((a, b) => a.pk - b.pk)
    .map((c) => c.name)
  const byName = new Map(sqlCols.map((c) => [c.name, c]))
  for (const col of cfg.columns) {
    const where = `${t}.${col.name}`
    const s = byName.get(col.name)
    if (!s) {
      out.push(`${where}: in drizzle (${col.getSQLType()}), missing from the migrations`)
      continue
    }
    byName.delete(col.name)
    if (affinity(s.type) !== affinity(col.getSQLType()))
      out.push(
        `${where}: type ${s.type} (${affinity(s.type)} affinity) in the migrations, ${col.getSQLType()} (${affinity(col.getSQLType())}) in drizzle`,
      )
    const sqlNotNull = s.notnull === 1 || (s.pk > 0 && sqlPk.length === 1)
    if (sqlNotNull !== col.notNull)
      out.push(
        `${where}: ${sqlNotNull ? 'NOT NULL' : 'nullable'} in the migrations, ${col.notNull ? 'notNull()' : 'nullable'} in drizzle`,
      )
    const dd = normalDefault(drizzleDefault(col))
    const sd = normalDefault(s.dflt_value)
    if (dd !== sd)
      out.push(`${where}: DEFAULT ${sd ?? '(none)'} in the migrations, default ${dd ?? '(none)'} in drizzle`)
  }
  for (const s of byName.values())
    out.push(`${t}.${s.name}: in the migrations (${s.type}), missing from the drizzle table`)
  if (sqlPk.join(', ') !== drizzlePk.join(', '))
    out.push(
      `${t}: primary key (${sqlPk.join(', ')}) in the migrations, (${drizzlePk.join(', ')}) in drizzle`,
    )

  // Indexes (CREATE INDEX) and UNIQUE constraints; the primary key's own index is covered above.
  const sqlIndexes = pragma<IndexInfo>(db, 'index_list', t)
  const drizzleIndexes = new Map(cfg.indexes.map((i) => [i.config.name, i.config]))
  for (const i of sqlIndexes.filter((i) => i.origin === 'c')) {
    const d = drizzleIndexes.get(i.name)
    if (!d) {
      out.push(`${t}: index ${i.name} (${sqliteIndexColumns(db, i.name)}) in the migrations, not in drizzle`)
      continue
    }
    drizzleIndexes.delete(i.name)
    const sqlCols = sqliteIndexColumns(db, i.name)
    const dCols = d.columns.map((c) => indexPart(c, t)).join(', ')
    if (sqlCols !== dCols)
      out.push(`${t}: index ${i.name} on (${sqlCols}) in the migrations, on (${dCols}) in drizzle`)
    if ((i.unique === 1) !== d.unique)
      out.push(
        `${t}: index ${i.name} is ${i.unique ? '' : 'not '}UNIQUE in the migrations, ${d.unique ? '' : 'not '}unique in drizzle`,
      )
    if ((i.partial === 1) !== (d.where !== undefined))
      out.push(
        `${t}: index ${i.name} is ${i.partial ? '' : 'not '}partial in the migrations, ${d.where ? '' : 'not '}in drizzle`,
      )
  }
  for (const [name, d] of drizzleIndexes)
    out.push(
      `${t}: index ${name} (${d.columns.map((c) => indexPart(c, t)).join(', ')}) in drizzle, not in the migrations`,
    )

  const sqlUnique = sqlIndexes
    .filter((i) => i.origin === 'u')
    .map((i) => sqliteIndexColumns(db, i.name))
    .sort()
  const drizzleUnique = [
    ...cfg.columns.filter((c) => c.isUnique).map((c) => c.name),
    ...cfg.uniqueConstraints.map((u) => u.columns.map((c) => c.name).join(', ')),
  ].sort()
  if (sqlUnique.join(' | ') !== drizzleUnique.join(' | '))
    out.push(
      `${t}: UNIQUE constraints [${sqlUnique.join(' | ')}] in the migrations, [${drizzleUnique.join(' | ')}] in drizzle`,
    )

  // Foreign keys.
  const groups = new Map<number, ForeignKeyInfo[]>()
  for (const fk of pragma<ForeignKeyInfo>(db, 'foreign_key_list', t))
    groups.set(fk.id, [...(groups.get(fk.id) ?? []), fk])
  const sqlFks = [...groups.values()]
    .map((rows) => {
      const first = rows[0] as ForeignKeyInfo
      const implicit = rows.some((r) => r.to === null)
      const to = implicit
        ? pragma<ColumnInfo>(db, 'table_info', first.table)
            .filter((c) => c.pk > 0)
            .sort((a, b) => a.pk - b.pk)
            .map((c) => c.name)
        : rows.map((r) => r.to as string)
      return fkText(
        rows.map((r) => r.from),
        first.table,
        to,
        first.on_update,
        first.on_delete,
      )
    })
    .sort()
  const drizzleFks = cfg.foreignKeys
    .map((fk) => {
      const ref = fk.reference()
      return fkText(
        ref.columns.map((c) => c.name),
        getTableConfig(ref.foreignTable).name,
        ref.foreignColumns.map((c) => c.name),
        fk.onUpdate ?? 'no action',
        fk.onDelete ?? 'no action',
      )
    })
    .sort()
  for (const f of sqlFks.filter((f) => !drizzleFks.includes(f)))
    out.push(`${t}: foreign key ${f} in the migrations, not in drizzle`)
  for (const f of drizzleFks.filter((f) => !sqlFks.includes(f)))
    out.push(`${t}: foreign key ${f} in drizzle, not in the migrations`)
  return out
}

/** Owners of tables: the core first (src/store/core/), as Host.boot migrates it, then every plugin. */
const owners: { id: string; migrations: readonly Migration[]; dbDir: string }[] = [
  { id: CORE_OWNER, migrations: coreMigrations, dbDir: 'src/store/core' },
  ...orderPlugins(plugins, new Set(plugins.map((p) => p.id))).map((def) => ({
    id: def.id,
    migrations: def.migrations ?? [],
    dbDir: `plugins/${def.id}/db`,
  })),
]

/** drizzleTables: every table exported by an owner's table modules (plugins/<id>/db/*.ts, src/store/core/*.ts). */
async function drizzleTables(dbDir: string): Promise<SQLiteTable[]> {
  const dir = join(import.meta.dir, '../..', dbDir)
  const tables: SQLiteTable[] = []
  if (!existsSync(dir)) return tables
  for (const file of new Bun.Glob('*.ts').scanSync({ cwd: dir })) {
    const mod = (await import(join(dir, file))) as Record<string, unknown>
    for (const v of Object.values(mod)) if (is(v, SQLiteTable)) tables.push(v)
  }
  return tables
}

function sqliteTables(db: Database): string[] {
  return db
    .query<{ name: string }, []>(
      "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != '_migrations' ORDER BY name",
    )
    .all()
    .map((r) => r.name)
}

const dir = mkdtempSync(join(tmpdir(), 'modelgate-migrations-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

/** migrateAll applies the core's and every plugin's migrations like Host.boot does, noting the tables each creates. */
function migrateAll(store: Store): Map<string, string[]> {
  const created = new Map<string, string[]>()
  for (const def of owners) {
    const before = new Set(sqliteTables(store.sqlite))
    applyMigrations(store, def.id, def.migrations)
    created.set(
      def.id,
      sqliteTables(store.sqlite).filter((n) => !before.has(n)),
    )
  }
  return created
}

describe('SQL migrations and drizzle schemas', () => {
  const store = openStore(dir, 'all.db')
  afterAll(() => store.close())
  const created = migrateAll(store)

  for (const def of owners) {
    it(`${def.id}: the migrated tables are the drizzle tables, column for column`, async () => {
      const tables = await drizzleTables(def.dbDir)
      const own = created.get(def.id) ?? []
      const declared = tables.map((tb) => getTableConfig(tb).name)
      const problems = [
        ...own
          .filter((n) => !declared.includes(n))
          .map((n) => `${n}: created by the migrations of ${def.id}, declared in no ${def.dbDir}/*.ts`),
        ...tables.flatMap((tb) => drift(store.sqlite, tb)),
      ]
      expect(problems).toEqual([])
    })
  }

  it('every plugin with migrations has its tables in drizzle, and migrating again changes nothing', () => {
    const withMigrations = plugins.filter((p) => (p.migrations ?? []).length > 0).map((p) => p.id)
    expect(withMigrations).toContain('gateway')
    expect(withMigrations).toContain('benchmarks')
    expect(created.get(CORE_OWNER)).toEqual([
      'inference_key_usage',
      'inference_keys',
      'oauth_used_states',
      'revoked_tokens',
    ])
    for (const id of withMigrations) expect(created.get(id)?.length ?? 0).toBeGreaterThan(0)
    expect([...migrateAll(store).values()].flat()).toEqual([])
  })
})

describe('drift detection', () => {
  const store = openStore(dir, 'drift.db')
  afterAll(() => store.close())
  store.sqlite.exec(`CREATE TABLE parent (id TEXT PRIMARY KEY NOT NULL);
    CREATE TABLE probe (
      id TEXT PRIMARY KEY NOT NULL,
      parent_id TEXT NOT NULL REFERENCES parent (id) ON DELETE CASCADE,
      n INTEGER NOT NULL DEFAULT 0,
      label TEXT,
      gone TEXT
    );
    CREATE INDEX probe_n ON probe (n);`)
  const parent = sqliteTable('parent', { id: text('id').primaryKey() })

  it('agrees with a matching definition', () => {
    const probe = sqliteTable(
      'probe',
      {
        id: text('id').primaryKey(),
        parent_id: text('parent_id')
          .notNull()
          .references(() => parent.id, { onDelete: 'cascade' }),
        n: integer('n').notNull().default(0),
        label: text('label'),
        gone: text('gone'),
      },
      (t) => [index('probe_n').on(t.n)],
    )
    expect(drift(store.sqlite, probe)).toEqual([])
  })

  it('names the table and column of every difference', () => {
    const probe = sqliteTable(
      'probe',
      {
        id: text('id').primaryKey(),
        parent_id: text('parent_id').notNull(),
        n: text('n').default('1'),
        label: text('label').notNull(),
        added: integer('added'),
      },
      (t) => [index('probe_n').on(t.n, t.label), index('probe_label').on(t.label)],
    )
    expect(drift(store.sqlite, probe)).toEqual([
      'probe.n: type INTEGER (INTEGER affinity) in the migrations, text (TEXT) in drizzle',
      'probe.n: NOT NULL in the migrations, nullable in drizzle',
      "probe.n: DEFAULT 0 in the migrations, default '1' in drizzle",
      'probe.label: nullable in the migrations, notNull() in drizzle',
      'probe.added: in drizzle (integer), missing from the migrations',
      'probe.gone: in the migrations (TEXT), missing from the drizzle table',
      'probe: index probe_n on (n) in the migrations, on (n, label) in drizzle',
      'probe: index probe_label (label) in drizzle, not in the migrations',
      'probe: foreign key (parent_id) REFERENCES parent (id) ON UPDATE NO ACTION ON DELETE CASCADE in the migrations, not in drizzle',
    ])
    expect(drift(store.sqlite, sqliteTable('absent', { id: text('id') }))).toEqual([
      'absent: declared in drizzle, but no migration creates it',
    ])
  })
})
