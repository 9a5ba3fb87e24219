import { Elysia } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import type { MemoryProfile } from '../../gateway/api.ts'
import { termAdmission } from '../internal-routes.ts'
import type { TermFence } from '../term.ts'
import {
  BenchmarkBundleSchema,
  LocalProfilesSchema,
  MergeResultSchema,
  ProfilesBody,
  RunIdsBody,
  RunIdsSchema,
} from './schemas.ts'
import type { ClusterFleet } from './service.ts'

/**
 * fleetInternalRoutes: what a pod's fleet calls ask of its peers (signed; verified at the front):
 * its memory profiles, a merge of profiles from a reconcile or an import, its finished benchmark
 * runs, and which of a bundle's run ids it has. 409 BENCHMARKS_DISABLED when its benchmarks plugin
 * is off (the asking pod then leaves it out).
 */
const tags = ['internal']
const Errors = { 400: ControllerError, 401: ControllerError, 409: ControllerError, 413: ControllerError }

export function fleetInternalRoutes(fleet: ClusterFleet, fence: TermFence) {
  return new Elysia({ name: 'cluster-fleet-internal-routes' })
    .use(termAdmission(fence))
    .get('/internal/memory-profiles', () => fleet.localProfiles(), {
      response: { 200: LocalProfilesSchema, ...Errors },
      detail: { tags, summary: "This pod's memory profiles: {podId, profiles[]}" },
    })
    .post('/internal/memory-profiles', ({ body }) => fleet.mergeProfiles(body.profiles as MemoryProfile[]), {
      body: ProfilesBody,
      response: { 200: MergeResultSchema, ...Errors },
      detail: {
        tags,
        summary: 'Merge profiles from a peer (reconcile, import): the newest of each key is kept',
        description: '200: {imported, skipped} as the single-pod import counts them.',
      },
    })
    .get('/internal/benchmarks/export', () => fleet.localBenchmarkBundle(), {
      response: { 200: BenchmarkBundleSchema, ...Errors },
      detail: { tags, summary: "This pod's finished benchmark runs as an export bundle" },
    })
    .post('/internal/benchmarks/existing', ({ body }) => ({ ids: fleet.localExisting(body.ids) }), {
      body: RunIdsBody,
      response: { 200: RunIdsSchema, ...Errors },
      detail: { tags, summary: 'Which of these benchmark run ids exist on this pod: {ids[]}' },
    })
}
