import { eq } from 'drizzle-orm'
import type { BunSQLiteDatabase } from 'drizzle-orm/bun-sqlite'
import { DEFAULT_ENGINE_KIND, type EngineKind, engineDriver } from '../../../src/engine/kinds.ts'
import type { GpuSnapshot } from '../../../src/gpu/smi.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { AppError, badRequest, conflict, notFound } from '../../../src/http/errors.ts'
import type { GatewayProfiles } from '../api.ts'
import { type CatalogRow, gatewayCatalog } from '../db/catalog.ts'
import { catalogFit } from './fit.ts'
import { entry, type Fields, fieldsProblem, foldName, nameProblem, withDefaults } from './rules.ts'
import type {
  CatalogChange,
  CatalogConfigEntry,
  CatalogEntry,
  CatalogEntryFields,
  CatalogSaved,
} from './schemas.ts'

/**
 * CatalogStore is the catalogue: the models this host may serve on demand, from two sources. The
 * YAML's entries (`plugins.gateway.catalog`, source `config`) are fixed for the life of the process
 * and changed only there; the API's (source `api`) are kept in SQLite and survive restarts. Names
 * are unique across both, whatever their case (the YAML's duplicates fail check-config; a save of
 * a name that differs only in case from an entry is 409), and looked up exactly. Every change made here goes out
 * on the bus as `gateway.catalog.changed`, so a reader keeps no copy that could drift. Reads come
 * from memory (a request that names a model may ask whether it is catalogued): this store is the
 * table's only writer, and it writes the row before it changes what it holds.
 */

/** CATALOG_MAX_SAVED: entries the API may hold, so a client cannot grow the table (and its lists) without end. */
export const CATALOG_MAX_SAVED = 1000

declare module '../../../src/host/bus.ts' {
  interface BusEvents {
    'gateway.catalog.changed': CatalogChange
  }
}

export interface CatalogDeps {
  db: BunSQLiteDatabase
  /** config: plugins.gateway.catalog as validated (names unique, not paths). */
  config: readonly CatalogConfigEntry[]
  /** configFile: the YAML file modelgate was started with, to name in a refusal (null: not from a file). */
  configFile: string | null
  bus: EventBus
  log: Logger
  snapshot: () => Promise<GpuSnapshot>
  estimate: GatewayProfiles['estimate']
  /** engineKind: the engine a catalogue load runs (plugins.gateway.engine.kind; default vllm). */
  engineKind?: EngineKind
}

const byName = (a: CatalogEntry, b: CatalogEntry) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)

function fromRow(r: CatalogRow): CatalogEntry {
  const { name, updated_at, ...f } = r
  return entry(name, f, 'api', updated_at)
}

/** requireName: the name, or 400 VALIDATION_ERROR saying why it cannot name an entry. */
function requireName(name: string): string {
  const bad = nameProblem(name)
  if (bad) throw badRequest(`name ${JSON.stringify(name.slice(0, 200))}: ${bad}`)
  return name
}

export class CatalogStore {
  /** configured: the YAML's entries by name, with their index for the dotted path. */
  private readonly configured = new Map<string, { index: number; entry: CatalogEntry }>()
  /** saved: the API's entries by name, as their rows hold them. */
  private readonly saved = new Map<string, CatalogEntry>()
  /** sorted: every entry by name, made again after a change. */
  private sorted: CatalogEntry[] | null = null

  constructor(private readonly deps: CatalogDeps) {
    deps.config.forEach((e, index) => {
      const { name, ...f } = e
      this.configured.set(name, { index, entry: entry(name, withDefaults(f), 'config', null) })
    })
    for (const row of deps.db.select().from(gatewayCatalog).all()) {
      this.saved.set(row.name, fromRow(row))
      // Saved before names were unique whatever their case, or before the YAML named it in another
      // case: both stay readable, and the operator is told.
      const twin = this.caseTwin(row.name)
      const index = twin && this.configured.get(twin.name)?.index
      if (twin)
        deps.log.warn(
          `catalogue entry '${row.name}' saved through the API differs only in case from '${twin.name}'` +
            `${index === undefined ? '' : ` (plugins.gateway.catalog[${index}])`}: remove one`,
          { entry: row.name },
        )
    }
  }

  list(): CatalogEntry[] {
    this.sorted ??= [...[...this.configured.values()].map((c) => c.entry), ...this.saved.values()].sort(
      byName,
    )
    return [...this.sorted]
  }

  get(name: string): CatalogEntry | undefined {
    return this.configured.get(name)?.entry ?? this.saved.get(name)
  }

  /** require: the entry, or 400 for a name that cannot be one, 404 CATALOG_ENTRY_NOT_FOUND. */
  require(name: string): CatalogEntry {
    const found = this.get(requireName(name))
    if (!found) throw this.notFound(name)
    return found
  }

  /**
   * save creates or replaces an API entry: 400 for a name that is a path or fields a load would
   * refuse, 409 for a name the YAML defines or a full catalogue, 400 CATALOG_ENTRY_TOO_LARGE when no
   * GPU set of this host could hold it (with the figures). Without a GPU probe it is saved with a
   * warning. The existence and count checks run with the write, after the probe's await.
   */
  async save(name: string, body: CatalogEntryFields): Promise<{ saved: CatalogSaved; created: boolean }> {
    requireName(name)
    this.refuseConfigured(name)
    this.refuseCaseTwin(name)
    const fields = withDefaults(body)
    const refused = fieldsProblem(
      name,
      fields,
      engineDriver(fields.engine_kind ?? this.deps.engineKind ?? DEFAULT_ENGINE_KIND),
    )
    if (refused) throw badRequest(refused)
    const verdict = catalogFit(name, fields, await this.deps.snapshot(), this.deps.estimate)
    if (verdict.fits === false) throw new AppError(400, 'CATALOG_ENTRY_TOO_LARGE', verdict.message)
    const { stored, created } = this.write(name, fields)
    this.deps.bus.emit('gateway.catalog.changed', { change: 'saved', entry: stored, created })
    this.deps.log.info(`catalogue entry ${name} ${created ? 'created' : 'replaced'}`, {
      model: fields.model_path,
      ...(verdict.fits === null ? { warning: verdict.warning } : {}),
    })
    return { saved: verdict.fits === null ? { ...stored, warning: verdict.warning } : stored, created }
  }

  /** remove deletes an API entry: 400 bad name, 409 defined in the YAML, 404 unknown. */
  remove(name: string): void {
    requireName(name)
    this.refuseConfigured(name)
    if (!this.saved.has(name)) throw this.notFound(name)
    this.deps.db.delete(gatewayCatalog).where(eq(gatewayCatalog.name, name)).run()
    this.saved.delete(name)
    this.sorted = null
    this.deps.bus.emit('gateway.catalog.changed', { change: 'removed', name })
    this.deps.log.info(`catalogue entry ${name} removed`)
  }

  /**
   * reviewConfig logs the YAML's entries this host could never hold (the check a save makes):
   * check-config cannot see the GPUs, so this is where an operator learns it, at start.
   */
  async reviewConfig(): Promise<void> {
    if (!this.configured.size) return
    const snapshot = await this.deps.snapshot()
    for (const { index, entry: e } of this.configured.values()) {
      const verdict = catalogFit(e.name, e, snapshot, this.deps.estimate)
      if (verdict.fits === false)
        this.deps.log.warn(`plugins.gateway.catalog[${index}]: ${verdict.message}`, { entry: e.name })
    }
  }

  /** caseTwin: the entry whose name differs from `name` only in case, if any. */
  private caseTwin(name: string): CatalogEntry | undefined {
    const folded = foldName(name)
    for (const n of [...this.configured.keys(), ...this.saved.keys()])
      if (n !== name && foldName(n) === folded) return this.get(n)
    return undefined
  }

  /** notFound: 404 CATALOG_ENTRY_NOT_FOUND, naming the entry spelled in another case when there is one. */
  private notFound(name: string): AppError {
    const twin = this.caseTwin(name)
    const hint = twin ? ` (names match exactly: there is '${twin.name}')` : ''
    return notFound(`No catalogue entry named '${name}'${hint}`, 'CATALOG_ENTRY_NOT_FOUND')
  }

  /** refuseCaseTwin: 409 CATALOG_NAME_TAKEN when another entry's name differs only in case. */
  private refuseCaseTwin(name: string): void {
    const twin = this.caseTwin(name)
    if (!twin) return
    const configured = this.configured.get(twin.name)
    const file = this.deps.configFile ?? 'the configuration modelgate was started with'
    const where = configured ? ` (defined in ${file}, plugins.gateway.catalog[${configured.index}])` : ''
    throw conflict(
      `'${name}' differs only in case from the catalogue entry '${twin.name}'${where}: names are unique whatever their case`,
      'CATALOG_NAME_TAKEN',
    )
  }

  private refuseConfigured(name: string): void {
    const configured = this.configured.get(name)
    if (!configured) return
    const file = this.deps.configFile ?? 'the configuration modelgate was started with'
    throw conflict(
      `Catalogue entry '${name}' is defined in ${file} (plugins.gateway.catalog[${configured.index}]): ` +
        'change or remove it there and restart modelgate',
      'CATALOG_ENTRY_FROM_CONFIG',
    )
  }

  /**
   * write upserts the row, then the entry held in memory; `created` when the name is new. Synchronous:
   * nothing can come between the checks and the write.
   */
  private write(name: string, f: Fields): { stored: CatalogEntry; created: boolean } {
    const created = !this.saved.has(name)
    if (created && this.saved.size >= CATALOG_MAX_SAVED)
      throw conflict(
        `The catalogue holds ${CATALOG_MAX_SAVED} saved entries, its limit: remove one first`,
        'CATALOG_FULL',
      )
    const value = { name, ...f, updated_at: new Date().toISOString() }
    this.deps.db
      .insert(gatewayCatalog)
      .values(value)
      .onConflictDoUpdate({ target: gatewayCatalog.name, set: value })
      .run()
    const stored = fromRow(value)
    this.saved.set(name, stored)
    this.sorted = null
    return { stored, created }
  }
}
