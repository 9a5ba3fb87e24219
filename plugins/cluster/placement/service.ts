import { pause } from '../../../src/host/abortable.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { AppError, conflict, toAppError } from '../../../src/http/errors.ts'
import type { GatewayPodApi, InstanceRecord, PresetDetail } from '../../gateway/api.ts'
import type { Leadership } from '../coordination/types.ts'
import type { PeerCalls } from '../peer-client.ts'
import type { RemoteLifecycle } from '../remote/service.ts'
import type { Pod } from '../schemas.ts'
import { type Need, type Placed, type PlanEntry, type PlanPod, planPreset } from './planner.ts'

/**
 * PresetPlacement applies a preset to the whole cluster, on the leader only: it reads every healthy
 * pod's GPUs and instances, plans (planner.ts: keep, unload, place with the gateway's memory
 * estimate), and, unless `dryRun`, unloads what the preset lacks (waiting until it is gone, so its
 * memory is free), then loads each placed entry on its pod and GPUs through the cluster's remote
 * lifecycle. Entries placed on one pod that share a GPU load one after another (the next when the one
 * before is active, as the single-pod preset load does: vLLM measures free memory as it starts);
 * the first of each such chain is started before the answer, the rest follow in the background.
 * One apply at a time (409 APPLY_IN_PROGRESS until its background loads are done).
 *
 * It also keeps the presets one across the pods: the leader sends its presets (full records) to every
 * healthy peer when it leads and the cluster changes (the routing table changes when a pod joins or a
 * leader is elected) and when a preset is saved or deleted on it.
 */
export interface PlacementCluster {
  readonly podId: string
  lead(): Leadership
  pods(): Pod[]
  ownerOf(instanceId: string): { podId: string } | null
}

export interface PlacementDeps {
  cluster: PlacementCluster
  gateway: GatewayPodApi
  remote: RemoteLifecycle
  peers: PeerCalls
  bus: EventBus
  log: Logger
  timeoutMs: number
  /** deadlines of the apply's waits (unload gone, a chain's predecessor active) */
  unloadTimeoutMs?: number
  readyTimeoutMs?: number
}

export interface AppliedPlaced {
  modelPath: string
  servedModelName: string
  podId: string
  gpuIds: number[]
  reason: string
  /** kept: already there; loading: started; queued: starts when the one before it on its GPU is active */
  status: 'kept' | 'loading' | 'queued' | 'planned'
  instanceId: string | null
}

export interface ApplyResult {
  presetId: string
  presetName: string
  dryRun: boolean
  placed: AppliedPlaced[]
  unplaceable: { modelPath: string; servedModelName: string; reason: string }[]
  unloaded: { modelPath: string; podId: string; instanceId: string; reason: string }[]
}

const KNOWN_STATUSES = new Set(['active', 'sleeping', 'starting'])

export class PresetPlacement {
  private running: Promise<void> | null = null
  private syncing: Promise<void> | null = null
  private syncAgain = false
  private readonly offs: (() => void)[] = []
  private stopped = false

  constructor(private readonly deps: PlacementDeps) {}

  start(): void {
    const kick = () => this.syncPresets()
    this.offs.push(
      this.deps.bus.on('cluster.routing', kick),
      this.deps.bus.on('gateway.presets.changed', kick),
    )
  }

  async stop(): Promise<void> {
    this.stopped = true
    for (const off of this.offs.splice(0)) off()
    await Promise.allSettled([this.syncing, this.running])
  }

  private requireLeader(): void {
    const lead = this.deps.cluster.lead()
    if (lead.isLeader) return
    if (!lead.leaderId)
      throw new AppError(503, 'NO_LEADER', 'No pod leads the cluster now; retry when one does')
    throw conflict(
      `Only the leader applies presets: pod ${lead.leaderId} at ${lead.leaderAddress ?? 'an unknown address'}`,
      'NOT_LEADER',
    )
  }

  async apply(presetId: string, dryRun: boolean): Promise<ApplyResult> {
    this.requireLeader()
    const preset = this.deps.gateway.presets.detail(presetId)
    if (!dryRun && this.running)
      throw conflict(
        'A preset is still being applied to the cluster; wait for it to finish',
        'APPLY_IN_PROGRESS',
      )
    const pods = await this.state()
    const plan = planPreset(preset.name, entriesOf(preset), pods, this.need())
    const result: ApplyResult = {
      presetId: preset.id,
      presetName: preset.name,
      dryRun,
      placed: plan.placed.map((p) => ({
        modelPath: p.modelPath,
        servedModelName: p.servedModelName,
        podId: p.podId,
        gpuIds: p.gpuIds,
        reason: p.reason,
        status: p.action === 'keep' ? 'kept' : 'planned',
        instanceId: p.instanceId,
      })),
      unplaceable: plan.unplaceable,
      unloaded: plan.unloaded,
    }
    if (dryRun) return result
    this.requireLeader()
    this.deps.log.info('applying preset to the cluster', {
      preset: preset.name,
      placed: plan.placed.length,
      unplaceable: plan.unplaceable.length,
      unloaded: plan.unloaded.length,
    })
    await this.unload(plan.unloaded.map((u) => u.instanceId))
    const loads = plan.placed
      .map((p, i) => ({ p, out: result.placed[i]! }))
      .filter((x) => x.p.action === 'load')
    const chains = chainsOf(loads)
    const rest: Promise<void>[] = []
    for (const chain of chains) {
      const [head, ...tail] = chain
      await this.startLoad(head!.p, head!.out, result)
      for (const x of tail) x.out.status = 'queued'
      if (tail.length) rest.push(this.follow(head!, tail, result))
    }
    // a load its pod refused is unplaceable now (startLoad moved it there)
    result.placed = result.placed.filter((p) => p.status !== 'planned')
    if (rest.length) {
      const done = Promise.allSettled(rest).then(() => {
        this.running = null
      })
      this.running = done
    }
    return result
  }

  /** state: every healthy pod's GPUs and instances, through the remote lifecycle's per-pod views. */
  private async state(): Promise<PlanPod[]> {
    const pods = this.deps.cluster
      .pods()
      .filter((p) => p.podId === this.deps.cluster.podId || p.status === 'healthy')
    return Promise.all(
      pods.map(async (p) => {
        const [gpus, models] = await Promise.all([
          this.deps.remote.gpuAvailable(p.podId),
          this.deps.remote.modelsFull(p.podId),
        ])
        return {
          podId: p.podId,
          gpus: gpus.gpus
            .filter((g) => g.memory_total_mb !== null && g.memory_free_mb !== null)
            .map((g) => ({
              index: g.index,
              name: g.name,
              totalGib: (g.memory_total_mb as number) / 1024,
              freeGib: (g.memory_free_mb as number) / 1024,
            })),
          instances: models.models.filter((m) => KNOWN_STATUSES.has(m.status)).map(planInstance),
        }
      }),
    )
  }

  private need(): Need {
    const cache = new Map<string, ReturnType<Need>>()
    return (e, g) => {
      const key = JSON.stringify([
        e.modelPath,
        e.maxTokens,
        g.name,
        g.totalGib,
        e.tensorParallelSize,
        e.gpuMemoryUtilization,
      ])
      let n = cache.get(key)
      if (!n) {
        const est = this.deps.gateway.profiles.estimate({
          model_path: e.modelPath,
          max_tokens: e.maxTokens ?? undefined,
          gpu_name: g.name,
          gpu_total_gib: g.totalGib,
          tensor_parallel_size: e.gpuIds.length || e.tensorParallelSize,
          gpu_memory_utilization: e.gpuMemoryUtilization ?? undefined,
        })
        n = {
          gib: est.gib,
          source: est.profile
            ? `profile '${est.profile.name}'`
            : "no profile: vLLM's gpu_memory_utilization × the device",
        }
        cache.set(key, n)
      }
      return n
    }
  }

  /** unload asks each owner to unload, then waits (deadline) until every one is gone from the cluster's view. */
  private async unload(ids: string[]): Promise<void> {
    if (!ids.length) return
    await Promise.all(ids.map((id) => this.deps.remote.unload(id)))
    const until = Date.now() + (this.deps.unloadTimeoutMs ?? 180_000)
    while (ids.some((id) => this.deps.cluster.ownerOf(id) !== null)) {
      if (Date.now() > until)
        throw new AppError(
          504,
          'UNLOAD_TIMEOUT',
          `instances ${ids.join(', ')} were not gone in time; nothing was loaded`,
        )
      await pause(100)
    }
  }

  private async startLoad(p: Placed, out: AppliedPlaced, result: ApplyResult): Promise<boolean> {
    const e = p.entry
    try {
      const res = await this.deps.remote.load({
        modelPath: e.modelPath,
        servedModelName: e.servedModelName,
        targetPodId: p.podId,
        gpuIds: p.gpuIds,
        tensorParallelSize: p.gpuIds.length,
        ...(e.maxTokens === null ? {} : { maxTokens: e.maxTokens }),
        ...(e.gpuMemoryUtilization === null ? {} : { gpuMemoryUtilization: e.gpuMemoryUtilization }),
        enableSleepMode: e.enableSleepMode,
        extraArgs: e.extraArgs,
        ...(e.engineKind ? { engineKind: e.engineKind } : {}),
      })
      out.status = 'loading'
      out.instanceId = res.instance_id
      return true
    } catch (err) {
      const a = toAppError(err)
      out.status = 'planned'
      result.unplaceable.push({
        modelPath: e.modelPath,
        servedModelName: e.servedModelName,
        reason: `pod ${p.podId} refused the load: ${a.code}: ${a.message}`,
      })
      return false
    }
  }

  /** follow: a chain's later entries, each once the one before it is active (or gave up). */
  private async follow(head: Step, tail: Step[], result: ApplyResult): Promise<void> {
    let prev = head
    for (const step of tail) {
      if (this.stopped) return
      if (prev.out.instanceId) await this.waitSettled(prev.out.podId, prev.out.instanceId)
      if (!(await this.startLoad(step.p, step.out, result)))
        this.deps.log.warn('preset entry refused by its pod', { model: step.p.modelPath, pod: step.p.podId })
      prev = step
    }
  }

  /** waitSettled: until the instance is active or sleeping, gone, failed, or the deadline passes. */
  private async waitSettled(podId: string, instanceId: string): Promise<void> {
    const until = Date.now() + (this.deps.readyTimeoutMs ?? 1_260_000)
    while (!this.stopped && Date.now() < until) {
      const pod = this.deps.cluster.pods().find((p) => p.podId === podId)
      const m = pod?.models.find((x) => x.instanceId === instanceId)
      const local = podId === this.deps.cluster.podId ? this.deps.gateway.get(instanceId) : undefined
      const status = local?.status ?? m?.status
      if (status === undefined || !['starting', 'standby'].includes(status)) return
      await pause(200)
    }
  }

  // ---- presets sync ----

  /** syncPresets: as leader, send every preset to every healthy peer (one run at a time, rerun on change). */
  syncPresets(): void {
    if (this.stopped || !this.deps.cluster.lead().isLeader) return
    if (this.syncing) {
      this.syncAgain = true
      return
    }
    this.syncing = this.pushPresets()
      .catch((err) => this.deps.log.warn('presets sync failed', { error: String(err) }))
      .finally(() => {
        this.syncing = null
        if (this.syncAgain) {
          this.syncAgain = false
          this.syncPresets()
        }
      })
  }

  private async pushPresets(): Promise<void> {
    const presets = this.deps.gateway.presets.list().map((s) => this.deps.gateway.presets.detail(s.id))
    const peers = this.deps.cluster
      .pods()
      .filter((p) => p.podId !== this.deps.cluster.podId && p.status === 'healthy')
    await Promise.all(
      peers.map((p) =>
        this.deps.peers
          .request(p, 'POST', '/internal/presets/sync', { presets }, { timeoutMs: this.deps.timeoutMs })
          .catch((err) =>
            this.deps.log.warn('presets sync to a pod failed', { pod: p.podId, error: String(err) }),
          ),
      ),
    )
  }
}

interface Step {
  p: Placed
  out: AppliedPlaced
}

/** chainsOf: per pod, loads that share a GPU form one chain (in plan order); disjoint ones run in parallel. */
function chainsOf(loads: Step[]): Step[][] {
  const chains: { pod: string; gpus: Set<number>; steps: Step[] }[] = []
  for (const s of loads) {
    const joined = chains.filter((c) => c.pod === s.p.podId && s.p.gpuIds.some((g) => c.gpus.has(g)))
    if (joined.length === 0) {
      chains.push({ pod: s.p.podId, gpus: new Set(s.p.gpuIds), steps: [s] })
      continue
    }
    const [first, ...others] = joined
    for (const o of others) {
      for (const g of o.gpus) first!.gpus.add(g)
      first!.steps.push(...o.steps)
      chains.splice(chains.indexOf(o), 1)
    }
    for (const g of s.p.gpuIds) first!.gpus.add(g)
    first!.steps.push(s)
  }
  return chains.map((c) => c.steps)
}

function entriesOf(p: PresetDetail): PlanEntry[] {
  return p.entries.map((e) => ({
    modelPath: e.modelPath,
    servedModelName: e.servedModelName,
    maxTokens: e.maxTokens,
    gpuIds: e.gpuIds,
    tensorParallelSize: e.tensorParallelSize,
    gpuMemoryUtilization: e.gpuMemoryUtilization,
    loadOrder: e.loadOrder,
    enableSleepMode: e.enableSleepMode,
    extraArgs: e.extraArgs,
    engineKind: e.engineKind ?? null,
  }))
}

function planInstance(m: InstanceRecord) {
  const footprint: Record<string, number> = {}
  const baseline = m.memory_baseline_by_gpu
  if (baseline) for (const [g, v] of Object.entries(baseline)) footprint[g] = v
  return {
    instanceId: m.id,
    modelPath: m.model_path,
    servedModelName: m.served_model_name,
    gpuIds: m.gpu_ids,
    status: m.status,
    engineKind: m.engine_kind,
    footprintGib: footprint,
  }
}
