import { hostname } from 'node:os'
import { AppError, conflict, toAppError } from '../../../src/http/errors.ts'
import { type BenchmarksApi, BUNDLE_FORMAT, BUNDLE_VERSION, type Bundle } from '../../benchmarks/api.ts'
import type { GatewayPodApi, MemoryProfile } from '../../gateway/api.ts'
import { PROFILE_BUNDLE_FORMAT, PROFILE_BUNDLE_VERSION } from '../../gateway/api.ts'
import type { PeerCalls } from '../peer-client.ts'
import type { Pod } from '../schemas.ts'

/**
 * ClusterFleet keeps memory profiles and benchmark runs one across the pods, over the signed internal
 * API (PeerClient) and each pod's own stores:
 *
 * - profiles: reconcile collects every healthy pod's profiles, keeps the newest of each key
 *   (model_path, max_tokens, gpu_name, tensor_parallel_size; by created_at, then id) and sends that
 *   unified set to every healthy pod, whose merge drops its older ones of the same key: afterwards
 *   every pod holds the same set. Export is the unified set as one single-pod bundle; import sends a
 *   bundle to every healthy pod.
 * - benchmarks: export merges every healthy pod's finished runs into one single-pod bundle (a run id
 *   on several pods once); import skips the runs that exist on any healthy pod and stores the rest on
 *   the pod asked.
 *
 * Collecting needs every healthy pod: a healthy pod that does not answer fails the call (502/504
 * naming it), because a partial "cluster" export or a reconcile missing a pod's newer profiles would
 * say something false. Pods already unhealthy (silent for unhealthy_after_missed heartbeats) are left
 * out and named in the result where there is room. Pushing reports each pod's outcome instead.
 */
export interface FleetCluster {
  readonly podId: string
  pods(): Pod[]
}

export interface FleetDeps {
  cluster: FleetCluster
  gateway: GatewayPodApi
  /** benchmarks: this pod's benchmarks plugin, when it is on (read when asked: plugins set up in any order). */
  benchmarks: () => BenchmarksApi | undefined
  peers: PeerCalls
  /** version: this modelgate's version, for the bundles' `source`. */
  version: string
  timeoutMs: number
}

interface Target {
  podId: string
  /** null: this pod. */
  address: string | null
}

type ProfileKey = Pick<MemoryProfile, 'model_path' | 'max_tokens' | 'gpu_name' | 'tensor_parallel_size'>
const keyOf = (p: ProfileKey) =>
  JSON.stringify([p.model_path, p.max_tokens, p.gpu_name, p.tensor_parallel_size])

/** newestPerKey: the newest profile of each key (created_at, then the larger id: deterministic), oldest first. */
export function newestPerKey(profiles: readonly MemoryProfile[]): MemoryProfile[] {
  const best = new Map<string, MemoryProfile>()
  for (const p of profiles) {
    const at = Date.parse(p.created_at)
    if (Number.isNaN(at)) continue
    const k = keyOf(p)
    const cur = best.get(k)
    const curAt = cur ? Date.parse(cur.created_at) : Number.NEGATIVE_INFINITY
    if (!cur || at > curAt || (at === curAt && p.id > cur.id)) best.set(k, p)
  }
  return [...best.values()].sort(
    (a, b) => Date.parse(a.created_at) - Date.parse(b.created_at) || (a.id < b.id ? -1 : 1),
  )
}

export const BENCHMARKS_DISABLED = 'BENCHMARKS_DISABLED'

export class ClusterFleet {
  constructor(private readonly deps: FleetDeps) {}

  /** targets: the healthy pods, this one first, then by id. */
  private targets(): Target[] {
    const self = this.deps.cluster.podId
    const pods = this.deps.cluster
      .pods()
      .filter((p) => p.podId === self || p.status === 'healthy')
      .sort((a, b) => (a.podId === self ? -1 : b.podId === self ? 1 : a.podId < b.podId ? -1 : 1))
    return pods.map((p) => ({ podId: p.podId, address: p.podId === self ? null : p.address }))
  }

  private call<T>(t: Target, method: string, path: string, body?: unknown): Promise<T> {
    return this.deps.peers.request<T>({ podId: t.podId, address: t.address as string }, method, path, body, {
      timeoutMs: this.deps.timeoutMs,
    })
  }

  // ---- memory profiles ----

  /** localProfiles: GET /internal/memory-profiles. */
  localProfiles(): { podId: string; profiles: MemoryProfile[] } {
    return { podId: this.deps.cluster.podId, profiles: this.deps.gateway.profiles.list() }
  }

  /** mergeProfiles: POST /internal/memory-profiles (and this pod's share of a push). */
  mergeProfiles(profiles: readonly MemoryProfile[]): { imported: number; skipped: number } {
    return this.deps.gateway.profiles.importAll(profiles)
  }

  /** unifiedProfiles: every healthy pod's profiles, the newest of each key. */
  async unifiedProfiles(): Promise<MemoryProfile[]> {
    const lists = await Promise.all(
      this.targets().map((t) =>
        t.address === null
          ? this.localProfiles().profiles
          : this.call<{ profiles: MemoryProfile[] }>(t, 'GET', '/internal/memory-profiles').then(
              (r) => r.profiles,
            ),
      ),
    )
    return newestPerKey(lists.flat())
  }

  async reconcile() {
    return this.pushProfiles(await this.unifiedProfiles())
  }

  async exportProfiles() {
    return {
      format: PROFILE_BUNDLE_FORMAT,
      version: PROFILE_BUNDLE_VERSION,
      exported_at: new Date().toISOString(),
      source: { modelgate_version: this.deps.version },
      profiles: await this.unifiedProfiles(),
    }
  }

  async importProfiles(bundle: { version: number; profiles: MemoryProfile[] }) {
    if (bundle.version > PROFILE_BUNDLE_VERSION)
      throw new AppError(
        400,
        'UNSUPPORTED_BUNDLE_VERSION',
        `bundle version ${bundle.version} is newer than this server reads (${PROFILE_BUNDLE_VERSION})`,
      )
    const bad = bundle.profiles.find((p) => Number.isNaN(Date.parse(p.created_at)))
    if (bad) throw new AppError(400, 'VALIDATION_ERROR', `profile ${bad.id}: created_at is not a timestamp`)
    return this.pushProfiles(bundle.profiles)
  }

  /** pushProfiles sends `profiles` to every healthy pod; each pod's outcome is reported. */
  private async pushProfiles(profiles: MemoryProfile[]) {
    const pods = await Promise.all(
      this.targets().map(async (t) => {
        try {
          const r =
            t.address === null
              ? this.mergeProfiles(profiles)
              : await this.call<{ imported: number; skipped: number }>(
                  t,
                  'POST',
                  '/internal/memory-profiles',
                  {
                    profiles,
                  },
                )
          return { podId: t.podId, ok: true, imported: r.imported, skipped: r.skipped }
        } catch (err) {
          const e = toAppError(err)
          return { podId: t.podId, ok: false, error: { code: e.code, message: e.message } }
        }
      }),
    )
    return { profiles: profiles.length, complete: pods.every((p) => p.ok), pods }
  }

  // ---- benchmarks ----

  private localBenchmarks(): BenchmarksApi {
    const api = this.deps.benchmarks()
    if (!api)
      throw conflict(`the benchmarks plugin is off on pod ${this.deps.cluster.podId}`, BENCHMARKS_DISABLED)
    return api
  }

  /** localBenchmarkBundle: GET /internal/benchmarks/export. */
  localBenchmarkBundle(): Bundle {
    return this.localBenchmarks().exportBundle()
  }

  /** localExisting: POST /internal/benchmarks/existing. */
  localExisting(ids: readonly string[]): string[] {
    return this.localBenchmarks().existing(ids)
  }

  /** forEachBenchmarkPod: `f` on every healthy pod with the benchmarks plugin (others are skipped). */
  private async forEachBenchmarkPod<T>(f: (t: Target) => Promise<T> | T): Promise<T[]> {
    const out = await Promise.all(
      this.targets().map(async (t) => {
        try {
          return [await f(t)]
        } catch (err) {
          if (err instanceof AppError && err.code === BENCHMARKS_DISABLED) return []
          throw err
        }
      }),
    )
    return out.flat()
  }

  async exportBenchmarks(): Promise<Bundle> {
    const bundles = await this.forEachBenchmarkPod((t) =>
      t.address === null
        ? this.localBenchmarkBundle()
        : this.call<Bundle>(t, 'GET', '/internal/benchmarks/export'),
    )
    const runs = new Map<string, Bundle['runs'][number]>()
    for (const b of bundles) for (const r of b.runs) if (!runs.has(r.id)) runs.set(r.id, r)
    return {
      format: BUNDLE_FORMAT,
      version: BUNDLE_VERSION,
      exported_at: new Date().toISOString(),
      source: { modelgate_version: this.deps.version, hostname: hostname() },
      runs: [...runs.values()].sort(
        (a, b) => Date.parse(a.created_at) - Date.parse(b.created_at) || (a.id < b.id ? -1 : 1),
      ),
    }
  }

  async importBenchmarks(bundle: Bundle) {
    const local = this.localBenchmarks()
    const ids = bundle.runs.map((r) => r.id)
    const elsewhere = await this.forEachBenchmarkPod(async (t) =>
      t.address === null
        ? { podId: t.podId, ids: [] as string[] }
        : {
            podId: t.podId,
            ids: (await this.call<{ ids: string[] }>(t, 'POST', '/internal/benchmarks/existing', { ids }))
              .ids,
          },
    )
    const onPeer = new Map<string, string>()
    for (const e of elsewhere) for (const id of e.ids) if (!onPeer.has(id)) onPeer.set(id, e.podId)
    const result = local.importBundle({ ...bundle, runs: bundle.runs.filter((r) => !onPeer.has(r.id)) })
    const skipped_runs = [
      ...[...onPeer].map(([id, podId]) => ({ id, reason: `already exists on pod ${podId}` })),
      ...result.skipped_runs,
    ]
    return { podId: this.deps.cluster.podId, ...result, skipped: skipped_runs.length, skipped_runs }
  }
}
