import type { EngineKind } from '../../../src/engine/kinds.ts'

/**
 * The preset planner: a pure function from the desired state (a preset's entries) and the current
 * state (every healthy pod's GPUs and instances) to a plan: what stays, what is unloaded, where each
 * remaining entry loads, and what cannot be placed and why. No clock, no I/O, no Map-order
 * dependence: the same state gives the same plan (pods by id, GPUs by index, entries by loadOrder).
 *
 * 1. Keep: an entry with an instance of the same model path and served name (active, sleeping or
 *    starting; the first by pod id, then instance id) is kept where it is, unless the entry names
 *    another engine than the instance runs (an entry without one keeps either).
 * 2. Unload: every other instance; its measured footprint on its GPUs counts as free from then on.
 * 3. Place the rest in the preset's load order, first come first served:
 *    - with gpuIds: the first pod (by id) on which all those GPUs exist and each has room;
 *      otherwise placed automatically, saying why;
 *    - automatically: on each pod, the tensorParallelSize GPUs with the least free memory that still
 *      fits (best fit: large holes stay for large models); the pod whose choice leaves the least
 *      room over wins, ties by pod id.
 *    Room is free memory (after unloads and earlier placements) ≥ the entry's need on that GPU (the
 *    gateway's estimate: a measured profile re-sized to the utilization and device, else vLLM's
 *    claim of gpu_memory_utilization × device). Whether a pod holds the weights on disk is not known
 *    to modelgate, so it plays no part.
 */
export interface PlanGpu {
  index: number
  name: string
  totalGib: number
  freeGib: number
}

export interface PlanInstance {
  instanceId: string
  modelPath: string
  servedModelName: string
  gpuIds: number[]
  status: string
  /** the engine it runs */
  engineKind: EngineKind
  /** what unloading it frees on each of its GPUs (GiB), by GPU index */
  footprintGib: Record<string, number>
}

export interface PlanPod {
  podId: string
  gpus: PlanGpu[]
  instances: PlanInstance[]
}

export interface PlanEntry {
  modelPath: string
  servedModelName: string
  maxTokens: number | null
  gpuIds: number[]
  tensorParallelSize: number
  gpuMemoryUtilization: number | null
  loadOrder: number
  /** carried to the load; placement ignores them */
  enableSleepMode: boolean
  extraArgs: string[]
  /** the engine it ran (null: the target pod's engine.kind) */
  engineKind: EngineKind | null
}

/** Need: an entry's memory on one GPU, and where the figure comes from (for the reason). */
export type Need = (entry: PlanEntry, gpu: PlanGpu) => { gib: number; source: string }

export interface Placed {
  modelPath: string
  servedModelName: string
  podId: string
  gpuIds: number[]
  reason: string
  /** keep: already there; load: to be loaded */
  action: 'keep' | 'load'
  instanceId: string | null
  entry: PlanEntry
}

export interface Unplaceable {
  modelPath: string
  servedModelName: string
  reason: string
}

export interface Unloaded {
  modelPath: string
  podId: string
  instanceId: string
  reason: string
}

export interface Plan {
  placed: Placed[]
  unplaceable: Unplaceable[]
  unloaded: Unloaded[]
}

const KEEPABLE = new Set(['active', 'sleeping', 'starting'])
const gib = (n: number) => `${(Math.round(n * 10) / 10).toFixed(1)} GiB`
const byId = <T extends { podId: string }>(a: T, b: T) => (a.podId < b.podId ? -1 : a.podId > b.podId ? 1 : 0)

export function planPreset(
  presetName: string,
  entries: readonly PlanEntry[],
  pods: readonly PlanPod[],
  need: Need,
): Plan {
  const sortedPods = [...pods].sort(byId).map((p) => ({
    ...p,
    gpus: [...p.gpus].sort((a, b) => a.index - b.index),
    instances: [...p.instances].sort((a, b) => (a.instanceId < b.instanceId ? -1 : 1)),
  }))
  const ordered = entries
    .map((e, i) => ({ e, i }))
    .sort((a, b) => a.e.loadOrder - b.e.loadOrder || a.i - b.i)
    .map((x) => x.e)
  const plan: Plan = { placed: [], unplaceable: [], unloaded: [] }

  // 1. keep
  const matched = new Set<string>()
  const toPlace: PlanEntry[] = []
  for (const e of ordered) {
    let kept = false
    for (const pod of sortedPods) {
      const inst = pod.instances.find(
        (i) =>
          !matched.has(i.instanceId) &&
          KEEPABLE.has(i.status) &&
          i.modelPath === e.modelPath &&
          i.servedModelName === e.servedModelName &&
          (e.engineKind === null || i.engineKind === e.engineKind),
      )
      if (!inst) continue
      matched.add(inst.instanceId)
      plan.placed.push({
        modelPath: e.modelPath,
        servedModelName: e.servedModelName,
        podId: pod.podId,
        gpuIds: inst.gpuIds,
        reason: `already ${inst.status} on pod ${pod.podId}, GPU ${inst.gpuIds.join(', ')}: kept`,
        action: 'keep',
        instanceId: inst.instanceId,
        entry: e,
      })
      kept = true
      break
    }
    if (!kept) toPlace.push(e)
  }

  // 2. unload, freeing what they hold
  const free = new Map<string, Map<number, number>>()
  for (const pod of sortedPods) free.set(pod.podId, new Map(pod.gpus.map((g) => [g.index, g.freeGib])))
  for (const pod of sortedPods)
    for (const inst of pod.instances) {
      if (matched.has(inst.instanceId)) continue
      plan.unloaded.push({
        modelPath: inst.modelPath,
        podId: pod.podId,
        instanceId: inst.instanceId,
        reason: `not in preset '${presetName}'`,
      })
      const f = free.get(pod.podId)!
      for (const [g, used] of Object.entries(inst.footprintGib))
        if (f.has(Number(g))) f.set(Number(g), f.get(Number(g))! + used)
    }

  // 3. place
  for (const e of toPlace) {
    const tp = e.gpuIds.length || e.tensorParallelSize
    let preface = ''
    if (e.gpuIds.length) {
      const named = namedPlacement(e, sortedPods, free, need)
      if (named) {
        plan.placed.push(named)
        take(free, named, sortedPods, need)
        continue
      }
      preface = `GPU ${e.gpuIds.join(', ')} of the preset have no room on any pod; `
    }
    const auto = autoPlacement(e, tp, sortedPods, free, need)
    if (auto) {
      auto.reason = preface + auto.reason
      plan.placed.push(auto)
      take(free, auto, sortedPods, need)
      continue
    }
    plan.unplaceable.push({
      modelPath: e.modelPath,
      servedModelName: e.servedModelName,
      reason: unfit(e, tp, sortedPods, free, need),
    })
  }
  return plan
}

type Free = Map<string, Map<number, number>>
type SortedPod = PlanPod

function describe(e: PlanEntry, pod: SortedPod, gpus: PlanGpu[], free: Free, need: Need): string {
  const f = free.get(pod.podId)!
  const parts = gpus.map((g) => `GPU ${g.index} ${gib(f.get(g.index)!)} free`)
  const n = need(e, gpus[0]!)
  return `pod ${pod.podId}, ${parts.join(', ')}; needs ${gib(n.gib)} per GPU (${n.source})`
}

function fits(e: PlanEntry, g: PlanGpu, free: Map<number, number>, need: Need): boolean {
  return (free.get(g.index) ?? 0) >= need(e, g).gib
}

function namedPlacement(e: PlanEntry, pods: SortedPod[], free: Free, need: Need): Placed | null {
  for (const pod of pods) {
    const gpus = e.gpuIds.map((i) => pod.gpus.find((g) => g.index === i))
    if (gpus.some((g) => !g)) continue
    const f = free.get(pod.podId)!
    if (!(gpus as PlanGpu[]).every((g) => fits(e, g, f, need))) continue
    return {
      modelPath: e.modelPath,
      servedModelName: e.servedModelName,
      podId: pod.podId,
      gpuIds: [...e.gpuIds],
      reason: `the preset's GPU ${e.gpuIds.join(', ')}: ${describe(e, pod, gpus as PlanGpu[], free, need)}`,
      action: 'load',
      instanceId: null,
      entry: e,
    }
  }
  return null
}

function autoPlacement(e: PlanEntry, tp: number, pods: SortedPod[], free: Free, need: Need): Placed | null {
  let best: { pod: SortedPod; gpus: PlanGpu[]; left: number } | null = null
  for (const pod of pods) {
    const f = free.get(pod.podId)!
    const room = pod.gpus
      .filter((g) => fits(e, g, f, need))
      .sort((a, b) => f.get(a.index)! - f.get(b.index)! || a.index - b.index)
    if (room.length < tp) continue
    const gpus = room.slice(0, tp)
    const left = gpus.reduce((s, g) => s + f.get(g.index)! - need(e, g).gib, 0)
    if (!best || left < best.left - 1e-9) best = { pod, gpus, left }
  }
  if (!best) return null
  const gpus = [...best.gpus].sort((a, b) => a.index - b.index)
  return {
    modelPath: e.modelPath,
    servedModelName: e.servedModelName,
    podId: best.pod.podId,
    gpuIds: gpus.map((g) => g.index),
    reason: `best fit: ${describe(e, best.pod, gpus, free, need)}`,
    action: 'load',
    instanceId: null,
    entry: e,
  }
}

function take(free: Free, p: Placed, pods: SortedPod[], need: Need): void {
  const pod = pods.find((x) => x.podId === p.podId)!
  const f = free.get(p.podId)!
  for (const i of p.gpuIds) {
    const g = pod.gpus.find((x) => x.index === i)!
    f.set(i, f.get(i)! - need(p.entry, g).gib)
  }
}

function unfit(e: PlanEntry, tp: number, pods: SortedPod[], free: Free, need: Need): string {
  const all = pods.flatMap((pod) =>
    pod.gpus.map((g) => ({ pod: pod.podId, g, free: free.get(pod.podId)!.get(g.index)!, need: need(e, g) })),
  )
  if (all.length === 0) return 'no healthy pod reports a GPU'
  all.sort((a, b) => b.free - a.free || (a.pod < b.pod ? -1 : a.pod > b.pod ? 1 : a.g.index - b.g.index))
  const n = all[0]!.need
  const most = all
    .slice(0, 3)
    .map((x) => `pod ${x.pod} GPU ${x.g.index} ${gib(x.free)}`)
    .join(', ')
  return `needs ${tp} GPU(s) on one pod with ${gib(n.gib)} free each (${n.source}); the most free: ${most}`
}
