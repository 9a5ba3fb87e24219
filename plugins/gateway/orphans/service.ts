import { resolve } from 'node:path'
import { type ProcessRef, sameProcess, stopProcesses } from '../../../src/engine/process.ts'
import type { GpuSnapshot } from '../../../src/gpu/smi.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { conflict, notFound } from '../../../src/http/errors.ts'
import { engineReasons, gpuMemoryByPid, type OrphanReason, shownCommand } from './engines.ts'
import { MARKER_DATA_DIR, MARKER_INSTANCE_ID, MARKER_VARS } from './marker.ts'
import { type ProcInfo, readEnvVars, readProc, startedAt } from './proc.ts'
import {
  ancestorsOfSelf,
  type HostProcesses,
  readHostProcesses,
  type StopUnit,
  stopUnits,
  treeUnit,
  type UnitRules,
} from './units.ts'

/**
 * OrphanService finds inference-engine processes on this host that this gateway does not manage (left
 * by a crash of another install, a previous data dir, a manual `vllm serve`, a worker that outlived its
 * parent) and stops one on an admin's request.
 *
 * A process is a candidate when it holds GPU memory (nvidia-smi compute apps) or looks like an engine
 * (`vllm serve`, vLLM's OpenAI entry point, a `VLLM::…` process name, `modelgate sim engine`). It is
 * managed, and never listed nor signalled, when it carries this data dir's marker with an instance id
 * this gateway knows (live instances and the rows still being recovered), is an instance's recorded
 * pid with its recorded start time, or is in the group of an instance whose leader is alive (a live
 * leader pins its group id). What is listed comes in stop units (units.ts): a candidate leading its
 * group with all of that group's members, or a candidate with its descendants.
 *
 * A kill re-reads the process right before signalling: the pid must still have the start time the
 * caller saw in the listing (a reused pid is never signalled), still be a candidate and still not be
 * managed, and no process of its unit may carry another install's marker (that install stops its own
 * engines). Then exactly the processes the last listing showed under it are signalled one by one, each
 * checked again by pid and start time (TERM, the grace, KILL): a process that joined the group since
 * is never reached, as a signal to the whole group would.
 */
export interface ManagedRef {
  id: string
  pid: number | null
  pgid: number | null
  process_start_time: string | null
}

export interface OrphanMarker {
  state: 'present' | 'absent' | 'unreadable'
  instance_id: string | null
  data_dir: string | null
  this_data_dir: boolean
}

export interface OrphanProcess {
  pid: number
  process_name: string
  command: string
  start_time: string
  engine: boolean
}

export interface OrphanOwner {
  install: 'none' | 'this' | 'another' | 'unknown'
  data_dir: string | null
}

export interface Orphan {
  pid: number
  pgid: number
  ppid: number
  process_name: string
  command: string
  start_time: string
  started_at: string | null
  reasons: OrphanReason[]
  gpu_memory_mib_by_gpu: Record<string, number>
  total_gpu_memory_mib: number
  marker: OrphanMarker
  owner: OrphanOwner
  stop_scope: 'group' | 'tree'
  processes: OrphanProcess[]
}

export interface OrphanList {
  orphans: Orphan[]
  total: number
  data_dir: string
  gpu_probe: { available: boolean; reason: string | null }
}

export interface KillResult {
  pid: number
  start_time: string
  stopped: boolean
  outcome: 'terminated' | 'killed' | 'gone'
  scope: 'group' | 'tree'
  signalled_pids: number[]
}

export interface OrphanDeps {
  probe: { snapshot(): Promise<GpuSnapshot> }
  /** managed: every instance this gateway manages or is recovering (recorded pid, group, start time). */
  managed: () => Iterable<ManagedRef>
  dataDir: string
  /** graceMs: SIGTERM → SIGKILL, as for the gateway's own engines. */
  graceMs: number
  log: Logger
}

interface Candidate {
  reasons: Set<OrphanReason>
  gpu: Map<number, number>
}

interface ManagedSet {
  /** recorded pid → recorded start time (null: unknown, the pid alone counts) */
  pids: Map<number, string | null>
  /** group of a live leader → the leader's start time */
  liveGroups: Map<number, number>
  ids: Set<string>
}

/** Survey: one look at the host, from which the listing and a kill are both computed. */
interface Survey {
  host: HostProcesses
  managed: ManagedSet
  candidates: Map<number, Candidate>
  markers: Map<number, OrphanMarker>
  rules: UnitRules
}

export class OrphanService {
  readonly dataDir: string
  private readonly kills = new Map<string, Promise<KillResult>>()
  /** listed: the processes the last listing showed under each entry (`pid:start_time`), what a kill signals */
  private listed = new Map<string, ProcessRef[]>()

  constructor(private readonly deps: OrphanDeps) {
    this.dataDir = resolve(deps.dataDir)
  }

  async list(): Promise<OrphanList> {
    const snapshot = await this.deps.probe.snapshot()
    const survey = this.survey(snapshot)
    const units = stopUnits(survey.host, survey.rules)
    this.listed = new Map(units.map((u) => [unitKey(u.lead), u.members.map(ref)]))
    const orphans = units.map((u) => this.view(u, survey))
    return {
      orphans,
      total: orphans.length,
      data_dir: this.dataDir,
      gpu_probe: snapshot.available
        ? { available: true, reason: null }
        : { available: false, reason: snapshot.reason },
    }
  }

  /** kill stops the orphan `pid` whose start time the caller saw as `startTime`. */
  kill(pid: number, startTime: string, by: string): Promise<KillResult> {
    const key = `${pid}:${startTime}`
    const running = this.kills.get(key)
    if (running) return running
    const p = this.doKill(pid, startTime, by).finally(() => this.kills.delete(key))
    this.kills.set(key, p)
    return p
  }

  private async doKill(pid: number, startTime: string, by: string): Promise<KillResult> {
    const snapshot = await this.deps.probe.snapshot()
    // From here to the first signal nothing awaits: what is checked is what is signalled.
    const info = readProc(pid)
    if (!info || info.state === 'Z') throw notFound(`No process with pid ${pid}`, 'ORPHAN_NOT_FOUND')
    const survey = this.survey(snapshot)
    if (this.isManaged(info, survey.managed, this.marker(pid)))
      throw conflict(
        `pid ${pid} belongs to an engine this modelgate manages; unload its instance instead`,
        'ORPHAN_MANAGED',
      )
    if (info.startTime !== startTime)
      throw conflict(
        `pid ${pid} is now another process (start time ${info.startTime}, not ${startTime}); nothing was signalled`,
        'ORPHAN_CHANGED',
      )
    if (!survey.candidates.has(pid))
      throw notFound(
        `pid ${pid} is not an orphan engine (no GPU memory, no engine command line)`,
        'ORPHAN_NOT_FOUND',
      )
    if (ancestorsOfSelf().has(pid))
      throw conflict(`pid ${pid} runs this modelgate (one of its parent processes)`, 'ORPHAN_NOT_PERMITTED')
    if (!maySignal(pid))
      throw conflict(`modelgate may not signal pid ${pid} (another user's process)`, 'ORPHAN_NOT_PERMITTED')
    const lead = survey.host.byPid.get(pid) ?? info
    const unit =
      stopUnits(survey.host, survey.rules).find((u) => u.lead.pid === pid) ??
      treeUnit(survey.host, lead, survey.rules)
    // What the caller was shown, else (nothing listed since this modelgate started) what a listing shows now.
    const shown = this.listed.get(unitKey(lead)) ?? unit.members.map(ref)
    const targets = shown.filter((t) => {
      const now = survey.host.byPid.get(t.pid)
      return now !== undefined && now.startTime === t.startTime && survey.rules.keep(now)
    })
    const owner = this.owner(unit.members.concat(targets.map((t) => survey.host.byPid.get(t.pid)!)), survey)
    if (owner.install === 'another')
      throw conflict(
        `pid ${pid} is an engine of another modelgate install (data dir ${owner.data_dir}); stop it through ` +
          'that modelgate, or by hand if that install is gone. Nothing was signalled',
        'ORPHAN_FOREIGN',
      )
    const command = shownCommand(info)
    const outcome = await stopProcesses(
      () => targets.filter((t) => sameProcess(t.pid, t.startTime)),
      this.deps.graceMs,
    )
    const result: KillResult = {
      pid,
      start_time: startTime,
      stopped: !sameProcess(pid, startTime),
      outcome,
      scope: unit.scope,
      signalled_pids: targets.map((t) => t.pid),
    }
    this.deps.log.info(`orphan engine ${pid} stopped`, {
      by,
      outcome: result.outcome,
      scope: result.scope,
      stopped: result.stopped,
      signalled: result.signalled_pids.join(','),
      command: command.slice(0, 300),
    })
    return result
  }

  private survey(snapshot: GpuSnapshot): Survey {
    const gpuByPid = gpuMemoryByPid(snapshot)
    const managed = this.managedSet()
    const host = readHostProcesses()
    const markers = new Map<number, OrphanMarker>()
    const markerOf = (pid: number) => {
      const known = markers.get(pid)
      if (known) return known
      const m = this.marker(pid)
      markers.set(pid, m)
      return m
    }
    const self = ancestorsOfSelf()
    const keep = (p: ProcInfo) => !self.has(p.pid) && !this.isManaged(p, managed, markerOf(p.pid))
    const candidates = new Map<number, Candidate>()
    for (const info of host.byPid.values()) {
      if (info.pid === process.pid) continue
      const reasons = new Set(engineReasons(info))
      const gpu = gpuByPid.get(info.pid) ?? new Map<number, number>()
      if (gpu.size > 0) reasons.add('gpu_memory')
      if (reasons.size === 0 || !keep(info)) continue
      candidates.set(info.pid, { reasons, gpu })
    }
    const rules: UnitRules = {
      isCandidate: (p) => candidates.has(p.pid),
      keep,
      ownPgid: host.byPid.get(process.pid)?.pgid,
    }
    return { host, managed, candidates, markers, rules }
  }

  private managedSet(): ManagedSet {
    const set: ManagedSet = { pids: new Map(), liveGroups: new Map(), ids: new Set() }
    for (const m of this.deps.managed()) {
      set.ids.add(m.id)
      if (!m.pid) continue
      set.pids.set(m.pid, m.process_start_time)
      if (m.process_start_time !== null && sameProcess(m.pid, m.process_start_time))
        set.liveGroups.set(m.pgid ?? m.pid, Number(m.process_start_time))
    }
    return set
  }

  private isManaged(info: ProcInfo, managed: ManagedSet, marker: OrphanMarker): boolean {
    if (marker.this_data_dir && marker.instance_id !== null && managed.ids.has(marker.instance_id))
      return true
    const recorded = managed.pids.get(info.pid)
    if (recorded !== undefined && (recorded === null || recorded === info.startTime)) return true
    // A live leader pins its group id: whatever of its group started after it is its engine's.
    const since = managed.liveGroups.get(info.pgid)
    return since !== undefined && Number(info.startTime) >= since
  }

  private marker(pid: number): OrphanMarker {
    const vars = readEnvVars(pid, MARKER_VARS)
    if (!vars) return { state: 'unreadable', instance_id: null, data_dir: null, this_data_dir: false }
    const id = vars[MARKER_INSTANCE_ID] ?? null
    const dir = vars[MARKER_DATA_DIR] ?? null
    if (id === null && dir === null)
      return { state: 'absent', instance_id: null, data_dir: null, this_data_dir: false }
    return { state: 'present', instance_id: id, data_dir: dir, this_data_dir: dir === this.dataDir }
  }

  /** owner: which install started a unit, by its processes' markers; another install's wins. */
  private owner(members: ProcInfo[], survey: Survey): OrphanOwner {
    const markers = members.map((m) => survey.markers.get(m.pid) ?? this.marker(m.pid))
    const foreign = markers.find((m) => m.state === 'present' && m.data_dir !== null && !m.this_data_dir)
    if (foreign) return { install: 'another', data_dir: foreign.data_dir }
    if (markers.some((m) => m.this_data_dir)) return { install: 'this', data_dir: this.dataDir }
    if (markers.some((m) => m.state === 'unreadable')) return { install: 'unknown', data_dir: null }
    return { install: 'none', data_dir: null }
  }

  private view(unit: StopUnit, survey: Survey): Orphan {
    const gpu = new Map<number, number>()
    const reasons = new Set<OrphanReason>()
    for (const m of unit.members) {
      const c = survey.candidates.get(m.pid)
      if (!c) continue
      for (const r of c.reasons) reasons.add(r)
      for (const [idx, mib] of c.gpu) gpu.set(idx, (gpu.get(idx) ?? 0) + mib)
    }
    const byGpu: Record<string, number> = {}
    for (const [idx, mib] of [...gpu].sort((a, b) => a[0] - b[0])) byGpu[String(idx)] = mib
    const info = unit.lead
    return {
      pid: info.pid,
      pgid: info.pgid,
      ppid: info.ppid,
      process_name: info.comm,
      command: shownCommand(info),
      start_time: info.startTime,
      started_at: startedAt(info.startTime),
      reasons: [...reasons],
      gpu_memory_mib_by_gpu: byGpu,
      total_gpu_memory_mib: [...gpu.values()].reduce((a, b) => a + b, 0),
      marker: survey.markers.get(info.pid) ?? this.marker(info.pid),
      owner: this.owner(unit.members, survey),
      stop_scope: unit.scope,
      processes: unit.members.map((m) => ({
        pid: m.pid,
        process_name: m.comm,
        command: shownCommand(m),
        start_time: m.startTime,
        engine: survey.candidates.has(m.pid),
      })),
    }
  }
}

function unitKey(info: ProcInfo): string {
  return `${info.pid}:${info.startTime}`
}

function ref(info: ProcInfo): ProcessRef {
  return { pid: info.pid, startTime: info.startTime }
}

function maySignal(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code !== 'EPERM'
  }
}
