/**
 * make-keys fills a new data dir with N inference keys, as the keys API would have stored them, for
 * the proxy benchmark (test/perf/proxy.ts): run in its own process, so that making them costs
 * nothing to the memory of the server measured with them. The first key has limits (requests and
 * tokens per minute, concurrency, a budget, one model) that no benchmark reaches; the others are
 * half with an rpm, half without. Prints one JSON line `{dataDir, key}` (the first key's secret).
 *
 *   bun test/perf/make-keys.ts --keys 1000
 */
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { digestOf, newSecret } from '../../src/http/keys/secret.ts'
import { CORE_OWNER, coreMigrations } from '../../src/store/core/migrations.ts'
import { inferenceKeys } from '../../src/store/core/schema.ts'
import { applyMigrations, openStore } from '../../src/store/db.ts'
import { numberArg } from './args.ts'

/** makeKeys: a data dir whose store holds `n` keys; the secret of the first, which has limits. */
function makeKeys(n: number): { dataDir: string; key: string } {
  const dataDir = mkdtempSync(join(tmpdir(), 'modelgate-bench-keys-'))
  const store = openStore(dataDir)
  applyMigrations(store, CORE_OWNER, coreMigrations)
  const key = newSecret()
  const now = Date.now()
  store.sqlite.transaction(() => {
    for (let i = 0; i < n; i++) {
      const limited = i === 0
      store.db
        .insert(inferenceKeys)
        .values({
          id: `key_bench_${i}`,
          name: `bench-${i}`,
          digest: digestOf(limited ? key : newSecret()),
          models: limited ? ['bench-model'] : null,
          rpm: limited ? 1_000_000_000 : i % 2 === 0 ? 600 : null,
          tpm: limited ? 1_000_000_000_000 : null,
          max_concurrent: limited ? 100_000 : null,
          budget_tokens: limited ? 1_000_000_000_000 : null,
          budget_period: limited ? 'month' : null,
          priority: 'normal',
          expires_at: null,
          created_at: now,
          version: now,
          revoked_at: null,
        })
        .run()
    }
  })()
  store.close()
  return { dataDir, key }
}

process.stdout.write(`${JSON.stringify(makeKeys(numberArg('--keys', 1000)))}\n`)
