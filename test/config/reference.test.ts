import { describe, expect, it } from 'bun:test'
import { readFileSync } from 'node:fs'
import { configReference, REFERENCE_PATH, referenceRows } from '../../build/config-reference.ts'

/**
 * config/REFERENCE.md is the one list of every configuration key, its type, default and meaning,
 * generated from the schemas. It must be what the generator prints now (a key, default or
 * description changed in a schema without `npm run docs:config` fails here), and every key must
 * carry its meaning in its schema, so the reference never has an empty row.
 */
describe('the configuration reference', () => {
  it('is what `npm run docs:config` writes from the schemas as they are', () => {
    const committed = readFileSync(REFERENCE_PATH, 'utf8')
    const fresh = configReference()
    if (committed !== fresh)
      throw new Error('config/REFERENCE.md is stale: run `npm run docs:config` and commit the result')
    expect(committed).toBe(fresh)
  })

  it("lists every key with a description from its schema, the plugins' keys under plugins.<id>", () => {
    const sections = referenceRows()
    const keys = sections.flatMap((s) => s.rows.map((r) => r.key))
    expect(sections.map((s) => s.section)).toEqual([
      'server',
      'data_dir',
      'log',
      'auth',
      'shutdown',
      'telemetry',
      'plugins.gateway',
      'plugins.benchmarks',
      'plugins.router',
      'plugins.cluster',
    ])
    // A few keys of each kind: a nested one, a list item's, a union's, an optional one, the loader's.
    for (const k of [
      'server.port',
      'auth.oauth.issuer_url',
      'plugins.gateway.engine.port_range.start',
      'plugins.gateway.catalog[].name',
      'plugins.cluster.coordination.static.peers[].address',
      'plugins.router.enabled',
    ])
      expect(keys).toContain(k)
    expect(new Set(keys).size).toBe(keys.length)
    const undescribed = sections.flatMap((s) => s.rows).filter((r) => !r.description.trim())
    expect(undescribed.map((r) => r.key)).toEqual([])
  })

  it('gives each default as the schema sets it', () => {
    const row = (key: string) =>
      referenceRows()
        .flatMap((s) => s.rows)
        .find((r) => r.key === key)
    expect(row('server.port')).toMatchObject({ type: 'integer, 0–65535', default: '3000' })
    expect(row('plugins.gateway.proxy.wake_on_request')).toMatchObject({
      type: '`reject` or `hold`',
      default: 'reject',
    })
    expect(row('auth.jwt_secret')?.default).toBe('—')
    expect(row('server.max_admin_body_bytes')).toMatchObject({ default: '16777216', hint: ' (16 MiB)' })
  })
})
