import { Elysia } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import type { Bundle } from '../../benchmarks/api.ts'
import type { MemoryProfile } from '../../gateway/api.ts'
import {
  BenchmarkBundleSchema,
  BenchmarkImportResultSchema,
  ProfileBundleSchema,
  ProfilesPushResultSchema,
} from './schemas.ts'
import type { ClusterFleet } from './service.ts'

/**
 * fleetRoutes: the cluster API's profile and benchmark routes (admin JWT; the writes admin only).
 * Bundles are the single-pod formats, so a cluster export imports into a single pod and the other
 * way round; bodies up to server.max_admin_body_bytes (16 MiB; 413 above).
 */
const tags = ['cluster']
const Errors = {
  400: ControllerError,
  401: ControllerError,
  403: ControllerError,
  409: ControllerError,
  413: ControllerError,
  502: ControllerError,
  504: ControllerError,
}
const COLLECT =
  ' Every healthy pod is asked (pods already unhealthy are left out); one that does not answer fails the call ' +
  'with 502 PEER_UNREACHABLE or 504 PEER_TIMEOUT naming it, rather than give a partial answer.'
const PUSH =
  ' 200: {profiles: how many were sent, complete: every healthy pod took them, pods: [{podId, ok, imported, ' +
  'skipped} or {podId, ok: false, error: {code, message}}]}; a pod that fails is reported, not retried.'

export function fleetRoutes(fleet: ClusterFleet) {
  return new Elysia({ name: 'cluster-fleet-routes' })
    .post('/api/cluster/memory-profiles/reconcile', () => fleet.reconcile(), {
      response: { 200: ProfilesPushResultSchema, ...Errors },
      detail: {
        tags,
        summary: 'Reconcile memory profiles: every pod ends with the newest of each key',
        description:
          'Collects every pod’s profiles, keeps the newest of each key (model_path, max_tokens, gpu_name, ' +
          'tensor_parallel_size; by created_at, then id) and sends that set to every pod, whose import drops ' +
          `its older profiles of the same key: afterwards all pods hold the same profiles.${COLLECT}${PUSH}`,
      },
    })
    .get('/api/cluster/memory-profiles/export', () => fleet.exportProfiles(), {
      response: { 200: ProfileBundleSchema, ...Errors },
      detail: {
        tags,
        summary: 'Export the cluster’s memory profiles as one bundle',
        description:
          'The single-pod bundle format (GET /api/memory/profiles/export): {format: "modelgate.memory-profiles", ' +
          `version: 1, exported_at, source, profiles[]}, holding the newest profile of each key on any pod.${COLLECT}`,
      },
    })
    .post(
      '/api/cluster/memory-profiles/import',
      ({ body }) => fleet.importProfiles(body as { version: number; profiles: MemoryProfile[] }),
      {
        body: ProfileBundleSchema,
        response: { 200: ProfilesPushResultSchema, ...Errors },
        detail: {
          tags,
          summary: 'Import a memory-profile bundle on every pod',
          description:
            'A profile bundle (a cluster or single-pod export) merged on every healthy pod as the single-pod ' +
            `import does (an id already there, or an older profile of a stored key, is skipped). 400 ` +
            `UNSUPPORTED_BUNDLE_VERSION for a newer format.${PUSH}`,
        },
      },
    )
    .get('/api/cluster/benchmarks/export', () => fleet.exportBenchmarks(), {
      response: { 200: BenchmarkBundleSchema, ...Errors },
      detail: {
        tags,
        summary: 'Export every pod’s finished benchmark runs as one bundle',
        description:
          'The single-pod bundle format (GET /api/benchmarks/export): {format: "modelgate.benchmarks", version: 1, ' +
          'exported_at, source, runs[] oldest first}; a run id held by several pods appears once. Pods without the ' +
          `benchmarks plugin are left out.${COLLECT}`,
      },
    })
    .post('/api/cluster/benchmarks/import', ({ body }) => fleet.importBenchmarks(body as Bundle), {
      body: BenchmarkBundleSchema,
      response: { 200: BenchmarkImportResultSchema, ...Errors },
      detail: {
        tags,
        summary: 'Import a benchmark bundle: runs that exist on any pod are skipped',
        description:
          'Runs whose id exists on any healthy pod are skipped ("already exists on pod <id>"); the rest are stored ' +
          'on the pod asked, with their ids. 200: {podId (where they were stored), imported, skipped, ' +
          'imported_ids[], skipped_runs[{id, reason}]}. 409 BENCHMARKS_DISABLED when this pod’s benchmarks ' +
          `plugin is off; 400 for another bundle version.${COLLECT}`,
      },
    })
}
