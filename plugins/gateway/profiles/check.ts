import { gpuMemoryMib } from '../../../src/gpu/memory.ts'
import type { GpuInfo, GpuSnapshot } from '../../../src/gpu/smi.ts'
import { badRequest, insufficientMemory } from '../../../src/http/errors.ts'
import type { LoadRequest, NeedQuery } from '../api.ts'
import type { PreloadCheck } from '../service.ts'
import { gpuTotalGib, type MemoryProfile, type ProfileStore, round4 } from './service.ts'

/**
 * checkPreload answers "will this model fit?" from its memory profile before anything is spawned:
 * the profile's per-GPU footprint against the free memory of the target GPUs. Both
 * POST /api/memory/profiles/check and the load endpoint (through makePreloadCheck) use it, so the
 * verdict a UI shows is the one the load applies.
 *
 * Levels: `info` no profile (or no GPU figures to compare with); `ok` footprint ≤ 85% of free;
 * `caution` ≤ 100%; `danger` above, or when gpu_memory_utilization × the GPU leaves vLLM no room
 * for a KV cache beside the profile's weights, CUDA graphs and overhead.
 */
export type WarningLevel = 'ok' | 'caution' | 'danger' | 'info'

/** OK_FRACTION: at most this share of the free memory is a comfortable fit. */
export const OK_FRACTION = 0.85

export interface CheckRequest {
  model_path: string
  max_tokens?: number | undefined
  gpu_ids?: number[] | undefined
  gpu_name?: string | undefined
  tensor_parallel_size?: number | undefined
  gpu_memory_utilization?: number | undefined
}

export interface CheckResult {
  warning_level: WarningLevel
  message: string
  profile_found: boolean
  estimated_memory_gib: number | null
  available_memory_gib: number | null
  gpu_name: string | null
  gpu_total_memory_gib: number | null
  gpu_ids: number[]
  profile_id: string | null
}

export interface CheckOptions {
  /** defaultUtilization: plugins.gateway.engine.gpu_memory_utilization, for requests that do not say. */
  defaultUtilization?: number
}

export interface SnapshotSource {
  gpuSnapshot(): Promise<GpuSnapshot>
}

const freeMib = (g: GpuInfo): number => gpuMemoryMib(g).free ?? 0
const gib = (n: number): string => `${n.toFixed(1)} GiB`

/** targetGpus: the named GPUs, else the best GPUs of a name, else the ones a load would pick (most free). */
function targetGpus(snapshot: GpuSnapshot & { available: true }, req: CheckRequest, tp: number): GpuInfo[] {
  if (req.gpu_ids) {
    return req.gpu_ids.map((i) => {
      const g = snapshot.gpus.find((x) => x.index === i)
      if (!g)
        throw badRequest(`GPU ${i} does not exist (GPUs: ${snapshot.gpus.map((x) => x.index).join(', ')})`)
      return g
    })
  }
  const pool = req.gpu_name ? snapshot.gpus.filter((g) => g.name === req.gpu_name) : snapshot.gpus
  return [...pool].sort((a, b) => freeMib(b) - freeMib(a) || a.index - b.index).slice(0, tp)
}

function where(gpus: GpuInfo[], binding: GpuInfo): string {
  const base = `GPU ${binding.index} (${binding.name})`
  return gpus.length > 1 ? `${base}, the least free of GPUs ${gpus.map((g) => g.index).join(', ')}` : base
}

/**
 * estimate: the profile's footprint, re-sized when the profile comes from an engine that claimed
 * utilization × device and this load asks for another utilization or runs on another device size.
 */
function estimate(p: MemoryProfile, util: number | undefined, deviceGib: number) {
  const nonKv = p.total_gpu_memory_gib - p.kv_cache_available_gib
  if (p.gpu_memory_utilization === null || util === undefined)
    return { gib: p.total_gpu_memory_gib, budget: null, nonKv }
  const budget = util * deviceGib
  const same =
    Math.abs(util - p.gpu_memory_utilization) < 0.001 && Math.abs(deviceGib - p.gpu_total_memory_gib) < 0.5
  return { gib: same ? p.total_gpu_memory_gib : Math.max(nonKv, budget), budget, nonKv }
}

export async function checkPreload(
  profiles: ProfileStore,
  source: SnapshotSource,
  req: CheckRequest,
  opts: CheckOptions = {},
): Promise<CheckResult> {
  if (req.gpu_ids && req.gpu_name) throw badRequest('body: give gpu_ids or gpu_name, not both')
  const tp = req.tensor_parallel_size ?? req.gpu_ids?.length ?? 1
  if (req.gpu_ids && req.gpu_ids.length !== tp)
    throw badRequest(`tensor_parallel_size (${tp}) must equal the number of gpu_ids (${req.gpu_ids.length})`)
  const snapshot = await source.gpuSnapshot()
  const gpus = snapshot.available ? targetGpus(snapshot, req, tp) : []
  const binding = gpus.reduce<GpuInfo | null>((m, g) => (m === null || freeMib(g) < freeMib(m) ? g : m), null)
  const gpuName = binding?.name ?? req.gpu_name ?? null
  const base = {
    gpu_name: gpuName,
    gpu_total_memory_gib: binding ? gpuTotalGib(binding) : null,
    gpu_ids: gpus.map((g) => g.index),
  }
  const what = `${req.model_path} (max_tokens ${req.max_tokens ?? 'default'}, TP ${tp})`
  if (gpuName === null) {
    const why = snapshot.available ? 'no GPU to compare with' : `GPU probe unavailable: ${snapshot.reason}`
    return { ...base, ...none(`No memory profile can be chosen for ${what}: ${why}`, null) }
  }
  const profile = profiles.find({
    model_path: req.model_path,
    max_tokens: req.max_tokens,
    gpu_name: gpuName,
    tensor_parallel_size: tp,
  })
  const util = req.gpu_memory_utilization ?? opts.defaultUtilization
  if (!profile && (binding === null || base.gpu_total_memory_gib === null || util === undefined))
    return {
      ...base,
      ...none(
        `No memory profile for ${what} on ${gpuName}; one is recorded when such a load becomes ready`,
        binding ? round4(freeMib(binding) / 1024) : null,
      ),
    }
  let est: { gib: number; budget: number | null; nonKv: number }
  let found: { profile_found: boolean; estimated_memory_gib: number; profile_id: string | null }
  let needs: string
  if (profile) {
    const deviceGib = base.gpu_total_memory_gib ?? profile.gpu_total_memory_gib
    est = estimate(profile, util, deviceGib)
    found = { profile_found: true, estimated_memory_gib: round4(est.gib), profile_id: profile.id }
    needs = `${req.model_path} needs about ${gib(est.gib)} per GPU (profile '${profile.profile_name}')`
  } else {
    // No profile yet: what the engine claims at start (utilization × the GPU), as the load's own
    // placement counts it, so the verdict and the load agree.
    const claim = (util as number) * (base.gpu_total_memory_gib as number)
    est = { gib: claim, budget: null, nonKv: 0 }
    found = { profile_found: false, estimated_memory_gib: round4(claim), profile_id: null }
    needs =
      `${req.model_path} claims ${gib(claim)} per GPU at start (gpu_memory_utilization ${util} × ` +
      `${gib(base.gpu_total_memory_gib as number)}; no memory profile recorded yet)`
  }
  let availableGib: number
  let place: string
  if (binding) {
    availableGib = round4(freeMib(binding) / 1024)
    place = where(gpus, binding)
  } else if (snapshot.available) {
    const total = profile?.gpu_total_memory_gib ?? 0
    availableGib = total
    place = `an empty ${gpuName} (none on this host)`
    base.gpu_total_memory_gib = total
  } else {
    return {
      ...base,
      ...found,
      warning_level: 'info',
      available_memory_gib: null,
      message: `${needs}; free memory unknown (GPU probe unavailable: ${snapshot.reason})`,
    }
  }
  const result = { ...base, ...found, available_memory_gib: availableGib }
  if (est.budget !== null && est.budget <= est.nonKv)
    return {
      ...result,
      warning_level: 'danger',
      message:
        `${needs}: at gpu_memory_utilization ${util} vLLM's budget of ${gib(est.budget)} on ${place} is below the ` +
        `${gib(est.nonKv)} it needs besides its KV cache, leaving no room for the KV cache`,
    }
  if (est.gib <= OK_FRACTION * availableGib)
    return {
      ...result,
      warning_level: 'ok',
      message: `${needs}; ${gib(availableGib)} free on ${place}: fits with ${gib(availableGib - est.gib)} to spare`,
    }
  if (est.gib <= availableGib)
    return {
      ...result,
      warning_level: 'caution',
      message:
        `${needs} of the ${gib(availableGib)} free on ${place} (${Math.round((100 * est.gib) / availableGib)}%): ` +
        'memory is tight, the load may succeed',
    }
  return {
    ...result,
    warning_level: 'danger',
    message: `${needs} but only ${gib(availableGib)} is free on ${place}: it will not fit`,
  }
}

function none(message: string, availableGib: number | null) {
  return {
    warning_level: 'info' as const,
    message,
    profile_found: false,
    estimated_memory_gib: null,
    available_memory_gib: availableGib,
    profile_id: null,
  }
}

/**
 * makePreloadCheck is the gateway's pre-load hook: after placement, a `danger` verdict from a memory
 * profile refuses the load with 400 INSUFFICIENT_MEMORY (the figures in the message) unless the body
 * says force: true.
 */
export function makePreloadCheck(
  profiles: ProfileStore,
  source: SnapshotSource,
  opts: CheckOptions = {},
): PreloadCheck {
  return async (req: LoadRequest, gpuIds: number[]) => {
    const r = await checkPreload(
      profiles,
      source,
      {
        model_path: req.model_path,
        max_tokens: req.max_tokens,
        gpu_ids: gpuIds,
        tensor_parallel_size: gpuIds.length,
        gpu_memory_utilization: req.gpu_memory_utilization,
      },
      opts,
    )
    // Without a profile the verdict is the engine's claim, which the placement itself holds the load
    // to (with the claims of loads in progress, and a shared-cache engine's own start): it decides.
    if (r.warning_level === 'danger' && r.profile_found)
      throw insufficientMemory(`${r.message}. Free memory first, or pass "force": true to load anyway`)
  }
}

/**
 * estimateNeed: the memory one engine of this load claims on each of its GPUs of this kind, by the
 * pre-load check's rule: the newest matching profile re-sized to this utilization and device; with
 * no profile, vLLM's own claim, gpu_memory_utilization × device (its weights are not known).
 */
export function estimateNeed(
  profiles: ProfileStore,
  q: NeedQuery,
  defaultUtilization: number,
): { gib: number; profile: { id: string; name: string } | null } {
  const util = q.gpu_memory_utilization ?? defaultUtilization
  const profile = profiles.find({
    model_path: q.model_path,
    max_tokens: q.max_tokens,
    gpu_name: q.gpu_name,
    tensor_parallel_size: q.tensor_parallel_size,
  })
  if (!profile) return { gib: round4(util * q.gpu_total_gib), profile: null }
  const est = estimate(profile, util, q.gpu_total_gib)
  return { gib: round4(est.gib), profile: { id: profile.id, name: profile.profile_name } }
}
