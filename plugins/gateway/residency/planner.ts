import { type BringBack, chanceOfUse, type EvictAction, secondsAfter } from './costs.ts'

/**
 * The residency planner: given what the GPUs hold and what a load or a wake needs, which instances
 * to put to sleep or unload, and how, so that it fits. Pure (no I/O, no clock): the manager gathers
 * the state, this decides, the manager carries it out. Deterministic for the same input.
 *
 * - `cost` (default): the actions that free enough memory at the least expected cost, where an
 *   action's expected cost is the chance the victim is asked for within the horizon times the time
 *   to bring it back after that action (costs.ts). Greedy on cost per MiB that helps, then any
 *   victim that turned out unneeded is dropped; across candidate GPU sets, the cheapest plan wins.
 * - `lru`: unload the least recently used until it fits (what llama-swap and Ollama do).
 * - `lru-sleep`: the least recently used sleeps at level 1 while host RAM allows, else is unloaded.
 *
 * Only instances that are evictable now are victims (the manager says why the others are not: a
 * request in flight or queued, pinned, loaded by hand, resident for less than min_resident_seconds).
 */
export type Policy = 'cost' | 'lru' | 'lru-sleep'

export interface GpuRoom {
  index: number
  /** Free memory, less what loads and wakes in progress will still take (MiB). */
  freeMib: number
}

export interface Resident {
  instanceId: string
  model: string
  gpuIds: number[]
  state: 'active' | 'sleeping'
  /** Memory it holds on each of its GPUs now (MiB). */
  holdsMib: number
  /** Memory a sleep leaves on each GPU (MiB): the CUDA context, or for kvcached its KV pages too. */
  afterSleepMib: number
  /** Host RAM a level-1 sleep parks (its weights on every GPU, MiB). */
  parkedMib: number
  sleepable: boolean
  /** The sleep levels its engine has (its driver's capabilities); absent: both. */
  sleepLevels?: readonly (1 | 2)[]
  evictable: boolean
  /** Epoch ms of its last request (null: never asked for). */
  lastUsed: number | null
  ratePerSecond: number
  bringBack: BringBack
}

export interface Need {
  model: string
  /** The GPU sets it could go on (a wake: its own GPUs only). */
  gpuChoices: number[][]
  /** What it needs free on each GPU of the set (MiB). */
  needMib: number
}

export interface PlanInput {
  policy: Policy
  gpus: GpuRoom[]
  residents: Resident[]
  need: Need
  hostBudgetMib: number
  hostUsedMib: number
  horizonSeconds: number
}

export interface Victim {
  instanceId: string
  model: string
  action: EvictAction
  freedMib: number
  expectedCostS: number
}

export interface Rejected {
  model: string
  instanceId: string
  action: EvictAction | null
  reason: string
}

export type Plan =
  | { fits: true; gpuIds: number[]; victims: Victim[]; rejected: Rejected[]; expectedCostS: number }
  | { fits: false; reason: string; rejected: Rejected[] }

/** A floor on the chance of use, so that among victims nobody asks for, a faster return still wins. */
const MIN_CHANCE = 1e-3

interface Option {
  r: Resident
  action: EvictAction
  freedMib: number
  cost: number
  parked: number
}

export function plan(input: PlanInput): Plan {
  const rejected = rejections(input)
  let best: Extract<Plan, { fits: true }> | null = null
  let lastReason = 'no GPU set to place it on'
  for (const set of input.need.gpuChoices) {
    const p = planOn(set, input)
    if (!p.fits) {
      lastReason = p.reason
      continue
    }
    if (
      !best ||
      p.expectedCostS < best.expectedCostS ||
      (p.expectedCostS === best.expectedCostS && p.victims.length < best.victims.length)
    )
      best = { ...p, rejected }
  }
  return best ?? { fits: false, reason: lastReason, rejected }
}

/** rejections: the residents that could not be victims, and why (for the decision's record). */
function rejections(input: PlanInput): Rejected[] {
  return input.residents
    .filter((r) => !r.evictable)
    .map((r) => ({ model: r.model, instanceId: r.instanceId, action: null, reason: 'not evictable now' }))
}

function planOn(
  set: number[],
  input: PlanInput,
): Extract<Plan, { fits: true }> | { fits: false; reason: string } {
  const room = new Map(input.gpus.map((g) => [g.index, g.freeMib]))
  const deficit = new Map<number, number>()
  for (const g of set) {
    const free = room.get(g)
    if (free === undefined) return { fits: false, reason: `GPU ${g} does not exist` }
    if (input.need.needMib > free) deficit.set(g, input.need.needMib - free)
  }
  if (deficit.size === 0) return { fits: true, gpuIds: set, victims: [], rejected: [], expectedCostS: 0 }
  const here = input.residents.filter((r) => r.evictable && r.gpuIds.some((g) => deficit.has(g)))
  const chosen =
    input.policy === 'cost'
      ? byCost(here, deficit, input)
      : byRecency(here, deficit, input, input.policy === 'lru-sleep')
  if (!chosen) {
    const short = [...deficit].map(([g, mib]) => `GPU ${g}: ${(mib / 1024).toFixed(1)} GiB short`).join(', ')
    return { fits: false, reason: `not enough memory can be freed now (${short})` }
  }
  const victims = chosen.map((o) => ({
    instanceId: o.r.instanceId,
    model: o.r.model,
    action: o.action,
    freedMib: o.freedMib,
    expectedCostS: o.cost,
  }))
  return {
    fits: true,
    gpuIds: set,
    victims,
    rejected: [],
    expectedCostS: victims.reduce((s, v) => s + v.expectedCostS, 0),
  }
}

/** options: the ways a resident can free memory, with what each frees per GPU and costs. */
function options(r: Resident, input: PlanInput): Option[] {
  const p = Math.max(MIN_CHANCE, chanceOfUse(r.ratePerSecond, input.horizonSeconds))
  const out: Option[] = []
  const cost = (a: EvictAction) => p * secondsAfter(a, r.bringBack)
  if (r.state === 'active' && r.sleepable) {
    const freed = Math.max(0, r.holdsMib - r.afterSleepMib)
    const levels = r.sleepLevels ?? [1, 2]
    if (levels.includes(1))
      out.push({ r, action: 'sleep1', freedMib: freed, cost: cost('sleep1'), parked: r.parkedMib })
    if (levels.includes(2))
      out.push({ r, action: 'sleep2', freedMib: freed, cost: cost('sleep2'), parked: 0 })
  }
  out.push({ r, action: 'unload', freedMib: r.holdsMib, cost: cost('unload'), parked: 0 })
  return out.filter((o) => o.freedMib > 0)
}

/** useful: how much of `freedMib` goes to GPUs still short. */
function useful(o: Option, deficit: Map<number, number>): number {
  let n = 0
  for (const g of o.r.gpuIds) {
    const d = deficit.get(g)
    if (d && d > 0) n += Math.min(d, o.freedMib)
  }
  return n
}

function apply(o: Option, deficit: Map<number, number>, sign = 1): void {
  for (const g of o.r.gpuIds) if (deficit.has(g)) deficit.set(g, deficit.get(g)! - sign * o.freedMib)
}

const covered = (deficit: Map<number, number>) => [...deficit.values()].every((d) => d <= 0)

/**
 * byCost: greedy on the cost of each MiB that helps: each step takes the cheapest of adding a
 * victim with one of its actions, or turning a chosen victim's action into one that frees more (a
 * level-1 sleep that leaves too much into an unload). Victims the others make unneeded are dropped.
 */
function byCost(here: Resident[], start: Map<number, number>, input: PlanInput): Option[] | null {
  const deficit = new Map(start)
  let host = input.hostBudgetMib - input.hostUsedMib
  const chosen = new Map<Resident, Option>()
  const all = new Map(here.map((r) => [r, options(r, input)]))
  while (!covered(deficit)) {
    let best: { o: Option; was: Option | null } | null = null
    let bestScore = Infinity
    for (const [r, opts] of all) {
      const was = chosen.get(r) ?? null
      if (was) apply(was, deficit, -1)
      for (const o of opts) {
        if (was && o.freedMib <= was.freedMib) continue
        // Only what parks more weights in host RAM is held to what is left of it (which a host
        // already over budget, level-1 sleeps decided together, has less than none of).
        const parks = o.parked - (was?.parked ?? 0)
        if (parks > 0 && parks > host) continue
        const gain = useful(o, deficit) - (was ? useful(was, deficit) : 0)
        if (gain <= 0) continue
        const score = (o.cost - (was?.cost ?? 0)) / gain
        if (score < bestScore || (score === bestScore && best && o.cost < best.o.cost)) {
          best = { o, was }
          bestScore = score
        }
      }
      if (was) apply(was, deficit)
    }
    if (!best) return null
    if (best.was) {
      apply(best.was, deficit, -1)
      host += best.was.parked
    }
    chosen.set(best.o.r, best.o)
    host -= best.o.parked
    apply(best.o, deficit)
  }
  const list = [...chosen.values()]
  // Drop any victim the others cover without it (the dearest first).
  for (const o of [...list].sort((a, b) => b.cost - a.cost)) {
    apply(o, deficit, -1)
    if (covered(deficit)) list.splice(list.indexOf(o), 1)
    else apply(o, deficit)
  }
  return list
}

function byRecency(
  here: Resident[],
  start: Map<number, number>,
  input: PlanInput,
  sleep: boolean,
): Option[] | null {
  const deficit = new Map(start)
  let host = input.hostBudgetMib - input.hostUsedMib
  const order = [...here].sort(
    (a, b) => (a.lastUsed ?? -1) - (b.lastUsed ?? -1) || a.instanceId.localeCompare(b.instanceId),
  )
  const chosen: Option[] = []
  for (const r of order) {
    if (covered(deficit)) break
    const opts = options(r, input)
    const asleep = sleep ? opts.find((o) => o.action === 'sleep1' && o.parked <= host) : undefined
    const o = asleep ?? opts.find((x) => x.action === 'unload')
    if (!o || useful(o, deficit) <= 0) continue
    chosen.push(o)
    host -= o.parked
    apply(o, deficit)
  }
  // Sleeps that left too much become unloads, least recently used first.
  for (let k = 0; k < chosen.length && !covered(deficit); k++) {
    const o = chosen[k]!
    const unload = options(o.r, input).find((x) => x.action === 'unload')
    if (!unload || unload.freedMib <= o.freedMib) continue
    apply(o, deficit, -1)
    apply(unload, deficit)
    chosen[k] = unload
  }
  return covered(deficit) ? chosen : null
}
