import { type Static, Type as T } from '@sinclair/typebox'
import { badRequest } from '../../src/http/errors.ts'
import type { RunRepository } from './repo.ts'
import { type BenchmarkRun, RunSchema, TERMINAL_STATUSES } from './schemas.ts'

/**
 * The benchmark export bundle, version 1: a JSON document carrying finished runs whole (run fields,
 * scenarios, metrics) in the same shape as GET /api/benchmarks/{id}, so a bundle can be read
 * without this code. Import keeps ids and skips runs that already exist, which makes it idempotent
 * and lets the cluster plugin merge bundles from several pods.
 *
 * ```json
 * { "format": "modelgate.benchmarks", "version": 1, "exported_at": "2026-11-21T18:00:00.000Z",
 *   "source": { "modelgate_version": "0.1.0", "hostname": "gpu-01" },
 *   "runs": [ { "id": "…", "name": "…", "status": "completed", "scenarios": [ { …, "metrics": {…} } ] } ] }
 * ```
 */
export const BUNDLE_FORMAT = 'modelgate.benchmarks'
export const BUNDLE_VERSION = 1

export const BundleSchema = T.Object(
  {
    format: T.Literal(BUNDLE_FORMAT),
    version: T.Integer({
      minimum: 1,
      description: `bundle format version; this server reads ${BUNDLE_VERSION}`,
    }),
    exported_at: T.String(),
    source: T.Object({ modelgate_version: T.String(), hostname: T.Optional(T.String()) }),
    runs: T.Array(RunSchema, { description: 'finished runs (completed, cancelled, failed), oldest first' }),
  },
  { description: 'Benchmark export bundle' },
)
export type Bundle = Omit<Static<typeof BundleSchema>, 'runs'> & { runs: BenchmarkRun[] }

export const ImportResultSchema = T.Object({
  imported: T.Integer(),
  skipped: T.Integer(),
  imported_ids: T.Array(T.String()),
  skipped_runs: T.Array(T.Object({ id: T.String(), reason: T.String() })),
})
export type ImportResult = Static<typeof ImportResultSchema>

export function exportBundle(repo: RunRepository, version: string, hostname?: string): Bundle {
  const runs = repo.terminalIds().flatMap((id) => {
    const run = repo.get(id)
    return run ? [run] : []
  })
  const source: Bundle['source'] = { modelgate_version: version }
  if (hostname) source.hostname = hostname
  return {
    format: BUNDLE_FORMAT,
    version: BUNDLE_VERSION,
    exported_at: new Date().toISOString(),
    source,
    runs,
  }
}

const terminal = new Set<string>(TERMINAL_STATUSES)

export function importBundle(repo: RunRepository, bundle: Bundle): ImportResult {
  if (bundle.version !== BUNDLE_VERSION) {
    throw badRequest(
      `unsupported bundle version ${bundle.version}; this server reads version ${BUNDLE_VERSION}`,
    )
  }
  const result: ImportResult = { imported: 0, skipped: 0, imported_ids: [], skipped_runs: [] }
  const skip = (id: string, reason: string) => {
    result.skipped++
    result.skipped_runs.push({ id, reason })
  }
  const seen = new Set<string>()
  for (const run of bundle.runs) {
    if (seen.has(run.id) || repo.exists(run.id)) {
      skip(run.id, 'already exists')
      continue
    }
    if (!terminal.has(run.status)) {
      skip(run.id, `status '${run.status}' is not a finished status`)
      continue
    }
    if (repo.anyScenarioExists(run.scenarios.map((s) => s.id))) {
      skip(run.id, 'a scenario id already exists in another run')
      continue
    }
    repo.insert(run)
    seen.add(run.id)
    result.imported++
    result.imported_ids.push(run.id)
  }
  return result
}
