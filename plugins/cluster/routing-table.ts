import type { PodState, RoutingEntry, RoutingTable } from './schemas.ts'

/**
 * Routing table: served model name → the pods that hold it. Only the leader builds one (from the
 * states its healthy pods last reported) and distributes it; every pod serves /v1 from the table it
 * adopted last, so a pod that loses its leader keeps routing with what it has.
 */

/** EMPTY_TABLE: what a pod routes with before any leader has sent one. */
export const EMPTY_TABLE: RoutingTable = { version: 0, term: 0, builtBy: null, entries: {} }

/** SERVING: instance states that take traffic (weight 1) or are woken by a request (weight 0). */
const WEIGHT: Record<string, number> = { active: 1, running: 1, sleeping: 0 }

/**
 * buildEntries maps each served model name to its holders: pods in podId order, running instances
 * before sleeping ones. Deterministic, so two leaders given the same states build the same entries.
 */
export function buildEntries(states: readonly PodState[]): Record<string, RoutingEntry[]> {
  const entries: Record<string, RoutingEntry[]> = {}
  const pods = [...states].sort((a, b) => a.podId.localeCompare(b.podId))
  for (const pod of pods) {
    const models = [...pod.models].sort((a, b) => a.instanceId.localeCompare(b.instanceId))
    for (const m of models) {
      const weight = WEIGHT[m.status]
      if (weight === undefined) continue
      const list = entries[m.modelName] ?? []
      list.push({ podId: pod.podId, podAddress: pod.address, vllmPort: m.port, weight })
      entries[m.modelName] = list
    }
  }
  for (const list of Object.values(entries)) list.sort((a, b) => b.weight - a.weight)
  return entries
}

/** sameEntries: two tables route alike (key order aside). */
export function sameEntries(a: RoutingTable['entries'], b: RoutingTable['entries']): boolean {
  return canonical(a) === canonical(b)
}

function canonical(entries: RoutingTable['entries']): string {
  return JSON.stringify(
    Object.keys(entries)
      .sort()
      .map((k) => [k, entries[k]]),
  )
}

/**
 * newer tells whether `candidate` should replace `current`: a higher term always wins (a new leader),
 * within a term a higher version does. A table from a lower term (a deposed leader) never does.
 */
export function newer(candidate: RoutingTable, current: RoutingTable): boolean {
  if (candidate.term !== current.term) return candidate.term > current.term
  return candidate.version > current.version
}

/** pickEntry: the hop target for a model, skipping this pod and pods already tried; running first. */
export function hopCandidates(table: RoutingTable, model: string, selfId: string): RoutingEntry[] {
  const list = table.entries[model] ?? []
  return list.filter((e) => e.podId !== selfId)
}
