import { listPids, type ProcInfo, readProc } from './proc.ts'

/**
 * How the orphans listing cuts the host's processes into what one DELETE stops (a stop unit), from one
 * read of /proc. A candidate (a process that looks like an engine) leading its own process group is
 * listed with every live member of that group, engine-looking or not, since those are what a stop of
 * the engine reaches; any other candidate is listed with its descendants. What is listed is what a
 * DELETE signals, and nothing else.
 */
export interface HostProcesses {
  /** every live process (zombies left out), by pid */
  byPid: Map<number, ProcInfo>
  byParent: Map<number, ProcInfo[]>
  byGroup: Map<number, ProcInfo[]>
}

export function readHostProcesses(): HostProcesses {
  const host: HostProcesses = { byPid: new Map(), byParent: new Map(), byGroup: new Map() }
  for (const pid of listPids()) {
    const info = readProc(pid)
    if (!info || info.state === 'Z') continue
    host.byPid.set(pid, info)
    push(host.byParent, info.ppid, info)
    push(host.byGroup, info.pgid, info)
  }
  return host
}

function push(map: Map<number, ProcInfo[]>, key: number, info: ProcInfo): void {
  const list = map.get(key)
  if (list) list.push(info)
  else map.set(key, [info])
}

export interface StopUnit {
  lead: ProcInfo
  /** group: the lead leads its process group; tree: the lead and its descendants */
  scope: 'group' | 'tree'
  /** the lead and the processes stopped with it, by pid */
  members: ProcInfo[]
}

export interface UnitRules {
  /** isCandidate: the process looks like an engine and is not managed */
  isCandidate(info: ProcInfo): boolean
  /** keep: a process that may be listed and signalled at all (not managed, not this modelgate or its parents) */
  keep(info: ProcInfo): boolean
  /** ownPgid: this modelgate's process group, never stopped as a group */
  ownPgid: number | undefined
}

/**
 * stopUnits: first every candidate leading a group (not modelgate's own) with its group; then each
 * candidate left that has no candidate above it, with its descendants not already listed.
 */
export function stopUnits(host: HostProcesses, rules: UnitRules): StopUnit[] {
  const candidates = [...host.byPid.values()]
    .filter((p) => rules.isCandidate(p))
    .sort((a, b) => a.pid - b.pid)
  const units: StopUnit[] = []
  const claimed = new Set<number>()
  for (const c of candidates) {
    if (c.pgid !== c.pid || c.pid === rules.ownPgid) continue
    const members = (host.byGroup.get(c.pid) ?? []).filter((p) => rules.keep(p))
    for (const m of members) claimed.add(m.pid)
    units.push({ lead: c, scope: 'group', members: sortByPid(members) })
  }
  const left = new Set(candidates.filter((c) => !claimed.has(c.pid)).map((c) => c.pid))
  for (const c of candidates) {
    if (!left.has(c.pid) || hasAncestorIn(host, c, left)) continue
    const members = [c, ...descendants(host, c.pid)].filter((p) => !claimed.has(p.pid) && rules.keep(p))
    for (const m of members) claimed.add(m.pid)
    units.push({ lead: c, scope: 'tree', members: sortByPid(members) })
  }
  return units.sort((a, b) => a.lead.pid - b.lead.pid)
}

/** treeUnit: a candidate stopped on its own, with its descendants (one listed inside another's unit). */
export function treeUnit(host: HostProcesses, lead: ProcInfo, rules: UnitRules): StopUnit {
  const members = [lead, ...descendants(host, lead.pid)].filter((p) => rules.keep(p))
  return { lead, scope: 'tree', members: sortByPid(members) }
}

function hasAncestorIn(host: HostProcesses, info: ProcInfo, pids: Set<number>): boolean {
  const seen = new Set<number>([info.pid])
  let ppid = info.ppid
  while (ppid > 0 && !seen.has(ppid)) {
    if (pids.has(ppid)) return true
    seen.add(ppid)
    ppid = host.byPid.get(ppid)?.ppid ?? 0
  }
  return false
}

/** descendants: every live process below `pid` (by parent pid). */
function descendants(host: HostProcesses, pid: number): ProcInfo[] {
  const out: ProcInfo[] = []
  const queue = [pid]
  const seen = new Set([pid])
  while (queue.length) {
    for (const c of host.byParent.get(queue.shift()!) ?? []) {
      if (seen.has(c.pid)) continue
      seen.add(c.pid)
      out.push(c)
      queue.push(c.pid)
    }
  }
  return out
}

/** ancestorsOfSelf: this process and its parents up to init (never to be signalled). */
export function ancestorsOfSelf(): Set<number> {
  const out = new Set<number>()
  let pid = process.pid
  while (pid > 0 && !out.has(pid)) {
    out.add(pid)
    pid = readProc(pid)?.ppid ?? 0
  }
  return out
}

function sortByPid(list: ProcInfo[]): ProcInfo[] {
  return [...list].sort((a, b) => a.pid - b.pid)
}
