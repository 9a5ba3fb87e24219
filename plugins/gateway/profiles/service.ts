import { randomUUID } from 'node:crypto'
import { and, desc, eq } from 'drizzle-orm'
import type { BunSQLiteDatabase } from 'drizzle-orm/bun-sqlite'
import type { GpuInfo, GpuSnapshot } from '../../../src/gpu/smi.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { AppError, badRequest, conflict, modelNotFound, notFound } from '../../../src/http/errors.ts'
import type { InstanceRecord } from '../api.ts'
import { gatewayMemoryProfiles, type MemoryProfile, type ProfileSource } from '../db/presets.ts'

/**
 * ProfileStore keeps memory profiles: what a model (at a context length and tensor parallelism)
 * measured per GPU on a kind of GPU. The pre-load check and the load endpoint read them; the
 * cluster plugin exchanges them as bundles. A profile's key is (model_path, max_tokens, gpu_name,
 * tensor_parallel_size); several profiles may share a key and the newest wins on lookup.
 */
export type { MemoryProfile, ProfileSource }

export interface ProfileKey {
  model_path: string
  /** max_tokens undefined: the profile with the largest max_tokens (a load without max_tokens uses the model's maximum). */
  max_tokens?: number | undefined
  gpu_name: string
  tensor_parallel_size?: number | undefined
}

export type NewProfile = Omit<MemoryProfile, 'id' | 'created_at'>

export interface ManualProfileInput {
  profileName: string
  modelPath: string
  maxTokens: number
  totalGpuMemoryGib: number
  weightsMemoryGib: number
  cudaGraphsGib: number
  gpuName: string
  gpuTotalMemoryGib: number
  overheadMemoryGib?: number | undefined
  kvCacheAvailableGib?: number | undefined
  tensorParallelSize?: number | undefined
  gpuMemoryUtilization?: number | undefined
  comments?: string | undefined
}

export const round4 = (n: number): number => Math.round(n * 10_000) / 10_000
const TOLERANCE_GIB = 0.05

/** gpuTotalGib: a GPU's total memory in GiB, or null when nvidia-smi does not say. */
export function gpuTotalGib(g: GpuInfo): number | null {
  return g.memoryTotalMib === null ? null : round4(g.memoryTotalMib / 1024)
}

export class ProfileStore {
  constructor(private readonly db: BunSQLiteDatabase) {}

  /** list: newest first. */
  list(): MemoryProfile[] {
    return this.db.select().from(gatewayMemoryProfiles).orderBy(desc(gatewayMemoryProfiles.created_at)).all()
  }

  get(id: string): MemoryProfile | undefined {
    return this.db.select().from(gatewayMemoryProfiles).where(eq(gatewayMemoryProfiles.id, id)).get()
  }

  require(id: string): MemoryProfile {
    const p = this.get(id)
    if (!p) throw notFound(`No memory profile with id '${id}'`, 'PROFILE_NOT_FOUND')
    return p
  }

  /** find: the newest profile matching the key exactly (see ProfileKey for an absent max_tokens). */
  find(key: ProfileKey): MemoryProfile | undefined {
    const matches = this.sameKey(key)
    if (key.max_tokens !== undefined) return matches[0]
    return [...matches].sort((a, b) => b.max_tokens - a.max_tokens)[0]
  }

  /** sameKey: profiles for a model on a GPU kind, newest first, filtered by whatever the key gives. */
  private sameKey(key: ProfileKey): MemoryProfile[] {
    const t = gatewayMemoryProfiles
    const where = [eq(t.model_path, key.model_path), eq(t.gpu_name, key.gpu_name)]
    if (key.max_tokens !== undefined) where.push(eq(t.max_tokens, key.max_tokens))
    if (key.tensor_parallel_size !== undefined)
      where.push(eq(t.tensor_parallel_size, key.tensor_parallel_size))
    return this.db
      .select()
      .from(t)
      .where(and(...where))
      .orderBy(desc(t.created_at))
      .all()
  }

  insert(p: NewProfile, id: string = randomUUID(), createdAt = new Date().toISOString()): MemoryProfile {
    const row: MemoryProfile = { ...p, id, created_at: createdAt }
    this.db.insert(gatewayMemoryProfiles).values(row).run()
    return row
  }

  /** recordAuto keeps one `auto` profile per key: a new measurement replaces the figures and the time. */
  recordAuto(p: NewProfile): MemoryProfile {
    const existing = this.sameKey(p).find((x) => x.source === 'auto')
    if (!existing) return this.insert(p)
    const row: MemoryProfile = { ...p, id: existing.id, created_at: new Date().toISOString() }
    this.db.update(gatewayMemoryProfiles).set(row).where(eq(gatewayMemoryProfiles.id, existing.id)).run()
    return row
  }

  delete(id: string): boolean {
    const found = this.get(id) !== undefined
    this.db.delete(gatewayMemoryProfiles).where(eq(gatewayMemoryProfiles.id, id)).run()
    return found
  }

  /**
   * importAll merges profiles from elsewhere (an import bundle, a cluster reconcile), oldest first so
   * the newest of each key is the one left: see merge. Timestamps are normalised so every comparison
   * is between instants, whatever offset a pod wrote; one that is not a timestamp is a 400.
   */
  importAll(profiles: readonly MemoryProfile[]): { imported: number; skipped: number } {
    const bad = profiles.find((p) => Number.isNaN(Date.parse(p.created_at)))
    if (bad) throw badRequest(`profile ${bad.id}: created_at is not a timestamp`)
    const result = { imported: 0, skipped: 0 }
    const ordered = profiles
      .map((p) => ({ ...p, created_at: new Date(p.created_at).toISOString() }))
      .sort((a, b) => Date.parse(a.created_at) - Date.parse(b.created_at))
    for (const p of ordered) result[this.merge(p)]++
    return result
  }

  /**
   * merge adds a profile from elsewhere (an import bundle): skipped when its id exists or a profile
   * of the same key is at least as new; otherwise stored, and the older profiles of its key removed,
   * so the newest survives on every pod that imports the same set.
   */
  merge(p: MemoryProfile): 'imported' | 'skipped' {
    if (this.get(p.id)) return 'skipped'
    const same = this.sameKey(p)
    if (same.some((x) => Date.parse(x.created_at) >= Date.parse(p.created_at))) return 'skipped'
    this.db.transaction((tx) => {
      for (const old of same)
        tx.delete(gatewayMemoryProfiles).where(eq(gatewayMemoryProfiles.id, old.id)).run()
      tx.insert(gatewayMemoryProfiles).values(p).run()
    })
    return 'imported'
  }
}

/** gpuOf finds an instance's GPU in a snapshot: its name and total key the profile. */
function gpuOf(snapshot: GpuSnapshot, index: number): GpuInfo | null {
  if (!snapshot.available) return null
  return snapshot.gpus.find((g) => g.index === index) ?? null
}

/** profileFromInstance turns a ready instance's per-GPU memory metrics into a profile, or null without metrics/GPU. */
export function profileFromInstance(
  inst: InstanceRecord,
  snapshot: GpuSnapshot,
  meta: { profileName: string; source: ProfileSource; comments: string | null },
): NewProfile | null {
  const m = inst.memory_metrics
  const gpu = gpuOf(snapshot, inst.gpu_ids[0] ?? 0)
  const total = gpu ? gpuTotalGib(gpu) : null
  if (!m || !gpu || total === null) return null
  return {
    profile_name: meta.profileName,
    model_path: inst.model_path,
    max_tokens: inst.max_tokens ?? m.max_model_len,
    total_gpu_memory_gib: m.total_gpu_memory_gib,
    weights_memory_gib: m.weights_memory_gib,
    cuda_graphs_gib: m.cuda_graph_memory_gib,
    overhead_memory_gib: m.overhead_memory_gib,
    kv_cache_available_gib: m.kv_cache_available_gib,
    gpu_name: gpu.name,
    gpu_total_memory_gib: total,
    tensor_parallel_size: inst.tensor_parallel_size,
    // A kvcached engine grows from its non-KV part instead of claiming utilization × device.
    gpu_memory_utilization: inst.sharedcache_enabled ? null : inst.gpu_memory_utilization,
    source: meta.source,
    comments: meta.comments,
  }
}

/** manualProfile validates a typed-in profile; the overhead and KV cache split the remainder. */
export function manualProfile(b: ManualProfileInput): NewProfile {
  const fixed = b.weightsMemoryGib + b.cudaGraphsGib
  const rest = b.totalGpuMemoryGib - fixed
  if (rest < -TOLERANCE_GIB)
    throw badRequest(
      `body.totalGpuMemoryGib (${b.totalGpuMemoryGib}) must be at least weightsMemoryGib + cudaGraphsGib (${round4(fixed)})`,
    )
  if (b.totalGpuMemoryGib > b.gpuTotalMemoryGib + TOLERANCE_GIB)
    throw badRequest(
      `body.totalGpuMemoryGib (${b.totalGpuMemoryGib}) must not exceed gpuTotalMemoryGib (${b.gpuTotalMemoryGib}): figures are per GPU`,
    )
  let overhead = b.overheadMemoryGib
  let kv = b.kvCacheAvailableGib
  if (overhead !== undefined && kv !== undefined) {
    if (Math.abs(overhead + kv - rest) > TOLERANCE_GIB)
      throw badRequest(
        `body: weights + cudaGraphs + overhead + kvCacheAvailable (${round4(fixed + overhead + kv)}) must equal totalGpuMemoryGib (${b.totalGpuMemoryGib})`,
      )
  } else if (overhead !== undefined) kv = rest - overhead
  else if (kv !== undefined) overhead = rest - kv
  else [overhead, kv] = [0, rest]
  if (overhead < -TOLERANCE_GIB || kv < -TOLERANCE_GIB)
    throw badRequest(
      `body: overheadMemoryGib and kvCacheAvailableGib leave a negative remainder of the total`,
    )
  return {
    profile_name: b.profileName.trim(),
    model_path: b.modelPath.trim(),
    max_tokens: b.maxTokens,
    total_gpu_memory_gib: b.totalGpuMemoryGib,
    weights_memory_gib: b.weightsMemoryGib,
    cuda_graphs_gib: b.cudaGraphsGib,
    overhead_memory_gib: round4(Math.max(0, overhead)),
    kv_cache_available_gib: round4(Math.max(0, kv)),
    gpu_name: b.gpuName.trim(),
    gpu_total_memory_gib: b.gpuTotalMemoryGib,
    tensor_parallel_size: b.tensorParallelSize ?? 1,
    gpu_memory_utilization: b.gpuMemoryUtilization ?? null,
    source: 'manual',
    comments: b.comments ?? null,
  }
}

/** instanceProfile: POST /api/memory/profiles with {instanceId}: 404 unknown, 409 before metrics exist. */
export async function instanceProfile(
  service: InstanceSource,
  b: { instanceId: string; profileName: string; comments?: string | undefined },
): Promise<NewProfile> {
  const inst = service.get(b.instanceId)
  if (!inst) throw modelNotFound(b.instanceId)
  if (!inst.memory_metrics)
    throw conflict(
      `Instance ${inst.id} (${inst.status}) has no parsed memory metrics yet; they are read when it becomes active`,
      'NO_MEMORY_METRICS',
    )
  const snapshot = await service.gpuSnapshot()
  if (!snapshot.available)
    throw new AppError(503, 'GPU_PROBE_UNAVAILABLE', `No GPU probe available: ${snapshot.reason}`)
  const p = profileFromInstance(inst, snapshot, {
    profileName: b.profileName.trim(),
    source: 'instance',
    comments: b.comments ?? null,
  })
  if (!p) throw conflict(`GPU ${inst.gpu_ids[0]} of instance ${inst.id} is not reported by the GPU probe`)
  return p
}

/** InstanceSource is what profiles need from the gateway: instances and GPU snapshots. */
export interface InstanceSource {
  get(id: string): InstanceRecord | undefined
  gpuSnapshot(): Promise<GpuSnapshot>
}

/**
 * ProfileRecorder records an `auto` profile each time an engine becomes ready with parsed memory
 * metrics (starting → active), one per key, so profiles follow what the hardware really does.
 */
export class ProfileRecorder {
  private readonly off: () => void
  private readonly pending = new Set<Promise<void>>()

  constructor(
    private readonly store: ProfileStore,
    private readonly service: InstanceSource,
    bus: EventBus,
    private readonly log: Logger,
  ) {
    this.off = bus.on('gateway.instance.status', (e) => {
      if (e.currentStatus !== 'active' || e.previousStatus !== 'starting' || !e.instance.memory_metrics)
        return
      const task = this.record(e.instance).finally(() => this.pending.delete(task))
      this.pending.add(task)
    })
  }

  private async record(inst: InstanceRecord): Promise<void> {
    try {
      const snapshot = await this.service.gpuSnapshot()
      const name = `${inst.model_name} · ${inst.max_tokens ?? inst.memory_metrics?.max_model_len} tokens`
      const p = profileFromInstance(inst, snapshot, {
        profileName: inst.tensor_parallel_size > 1 ? `${name} · TP ${inst.tensor_parallel_size}` : name,
        source: 'auto',
        comments: `recorded when instance ${inst.id} became ready`,
      })
      if (!p) {
        this.log.debug('no memory profile recorded (no GPU info)', { instance: inst.id })
        return
      }
      const saved = this.store.recordAuto(p)
      this.log.info('memory profile recorded', { profile: saved.id, instance: inst.id, gpu: p.gpu_name })
    } catch (err) {
      this.log.warn('could not record a memory profile', { instance: inst.id, error: String(err) })
    }
  }

  /** stop unsubscribes and waits for recordings in flight (they write to the store). */
  async stop(): Promise<void> {
    this.off()
    await Promise.allSettled([...this.pending])
  }
}
