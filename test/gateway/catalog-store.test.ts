import { afterAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { CATALOG_MAX_SAVED, CatalogStore } from '../../plugins/gateway/catalog/store.ts'
import gateway from '../../plugins/gateway/index.ts'
import { EventBus } from '../../src/host/bus.ts'
import { Logger } from '../../src/host/logger.ts'
import type { AppError } from '../../src/http/errors.ts'
import { applyMigrations, openStore } from '../../src/store/db.ts'

/**
 * The catalogue store on a real SQLite file, without a server: its bound on the entries the API may
 * hold (a client cannot grow the table and every list without end), and what a new store on the
 * same file reads back. The GPU probe is absent here, so every save is unchecked.
 */
const dir = mkdtempSync(join(tmpdir(), 'modelgate-catalog-store-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

function storeOn(file: string) {
  const store = openStore(dir, file)
  applyMigrations(store, 'gateway', gateway.migrations ?? [])
  const catalog = new CatalogStore({
    db: store.db,
    config: [{ name: 'from-yaml', model_path: 'a/b' }],
    configFile: null,
    bus: new EventBus(),
    log: new Logger('error', 'test', 'text', () => {}),
    snapshot: async () => ({ available: false, reason: 'no probe in this test' }),
    estimate: () => ({ gib: 1, profile: null }),
  })
  return { store, catalog }
}

describe('the catalogue store', () => {
  it(`holds at most ${CATALOG_MAX_SAVED} entries saved through the API; replacing one at the limit still works`, async () => {
    const { store, catalog } = storeOn('full.db')
    for (let i = 0; i < CATALOG_MAX_SAVED; i++) await catalog.save(`m${i}`, { model_path: 'x/y' })
    const err = (await catalog.save('one-more', { model_path: 'x/y' }).catch((e) => e)) as AppError
    expect([err.status, err.code]).toEqual([409, 'CATALOG_FULL'])
    const replaced = await catalog.save('m7', { model_path: 'x/z', pin: true })
    expect(replaced.created).toBe(false)
    expect(replaced.saved).toMatchObject({ name: 'm7', model_path: 'x/z', pin: true })
    // The YAML's entries do not count against the bound.
    expect(catalog.list()).toHaveLength(CATALOG_MAX_SAVED + 1)
    catalog.remove('m0')
    expect((await catalog.save('one-more', { model_path: 'x/y' })).created).toBe(true)
    store.close()
  }, 60_000)

  it('reads back on the same file what it saved, and forgets what it removed', async () => {
    const first = storeOn('again.db')
    await first.catalog.save('org/kept:1', { model_path: 'x/y', gpu_ids: [1, 0], extra_args: ['--a', 'b c'] })
    await first.catalog.save('gone', { model_path: 'x/y' })
    first.catalog.remove('gone')
    const before = first.catalog.list()
    first.store.close()
    const second = storeOn('again.db')
    expect(second.catalog.list()).toEqual(before)
    expect(second.catalog.get('org/kept:1')).toMatchObject({
      gpu_ids: [1, 0],
      tensor_parallel_size: 2,
      extra_args: ['--a', 'b c'],
      source: 'api',
    })
    expect(second.catalog.get('gone')).toBeUndefined()
    second.store.close()
  })
})
