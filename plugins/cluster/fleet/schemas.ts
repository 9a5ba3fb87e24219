import { t } from 'elysia'
import { BundleSchema as BenchmarkBundleSchema } from '../../benchmarks/api.ts'
import { ProfileBundleSchema, ProfileSchema } from '../../gateway/api.ts'

/**
 * The fleet routes' bodies, and the internal ones. Bundles
 * are the single-pod export formats unchanged, so a cluster export imports into one pod and back.
 */
export { BenchmarkBundleSchema, ProfileBundleSchema }

export const PodOutcomeSchema = t.Object({
  podId: t.String(),
  ok: t.Boolean(),
  imported: t.Optional(t.Integer()),
  skipped: t.Optional(t.Integer()),
  error: t.Optional(t.Object({ code: t.String(), message: t.String() })),
})

export const ProfilesPushResultSchema = t.Object({
  profiles: t.Integer({ description: 'profiles sent to every pod (the unified set, or the bundle)' }),
  complete: t.Boolean({ description: 'every pod took them (else see pods[].error)' }),
  pods: t.Array(PodOutcomeSchema),
})

/** GET /internal/memory-profiles: this pod's profiles. */
export const LocalProfilesSchema = t.Object({ podId: t.String(), profiles: t.Array(ProfileSchema) })

/** POST /internal/memory-profiles: profiles to merge (newest of each key kept). */
export const ProfilesBody = t.Object({ profiles: t.Array(ProfileSchema, { maxItems: 100_000 }) })

export const MergeResultSchema = t.Object({ imported: t.Integer(), skipped: t.Integer() })

/** POST /internal/benchmarks/existing: which of these run ids this pod has. */
export const RunIdsBody = t.Object({ ids: t.Array(t.String({ maxLength: 256 }), { maxItems: 100_000 }) })
export const RunIdsSchema = t.Object({ ids: t.Array(t.String()) })

export const BenchmarkImportResultSchema = t.Object({
  podId: t.String({ description: 'the pod that stored the imported runs (the one asked)' }),
  imported: t.Integer(),
  skipped: t.Integer(),
  imported_ids: t.Array(t.String()),
  skipped_runs: t.Array(t.Object({ id: t.String(), reason: t.String() })),
})
