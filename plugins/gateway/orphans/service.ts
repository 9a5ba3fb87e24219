import { resolve } from 'node:path'
import { isAlive, sameProcess, stopGroup, waitFor } from '../../../src/engine/process.ts'
import type { GpuSnapshot } from '../../../src/gpu/smi.ts'
import type { Logger } from '../../../src/host/logger.ts'
import { conflict, notFound } from '../../../src/http/errors.ts'
import { MARKER_DATA_DIR, MARKER_INSTANCE_ID, MARKER_VARS } from './marker.ts'
import { listPids, type ProcInfo, readEnvVars, readProc, startedAt } from './proc.ts'

/**
 * OrphanService finds inference-engine processes on this host that this gateway does not manage (left
 * by a crash of another install, a previous data dir, a manual `vllm serve`, a worker that outlived its
 * parent) and stops one on an admin's request.
 *
 * A process is a candidate when it holds GPU memory (nvidia-smi compute apps) or looks like an engine
 * (`vllm serve`, vLLM's OpenAI entry point, a `VLLM::…` process name, `modelgate sim engine`). It is
 * managed, and never listed nor signalled, when it is an instance's recorded pid or in an instance's
 * process group (live instances and the rows still being recovered), or carries this data dir's marker
 * with an instance id this gateway knows. Candidates of one process group are listed once, under the
 * group leader when it is a candidate itself.
 *
 * A kill re-reads the process right before signalling: the pid must still have the start time the
 * caller saw in the listing (a reused pid is never signalled), still be a candidate and still not be
 * managed. A group leader is stopped as a group (TERM, the grace, KILL), anything else as a tree (it and
 * its descendants, each checked by start time again before the KILL).
 */
export type OrphanReason = 'gpu_memory' | 'vllm_command' | 'engine_process_name' | 'simulator'

export interface ManagedRef {
  id: string
  pid: number | null
  pgid: number | null
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
  /** managed: every instance this gateway manages or is recovering (recorded pid and process group). */
  managed: () => Iterable<ManagedRef>
  dataDir: string
  /** graceMs: SIGTERM → SIGKILL, as for the gateway's own engines. */
  graceMs: number
  log: Logger
}

interface Candidate {
  info: ProcInfo
  reasons: Set<OrphanReason>
  gpu: Map<number, number>
}

interface ManagedSet {
  pids: Set<number>
  pgids: Set<number>
  ids: Set<string>
}

/** How long a SIGKILLed process may take to vanish before the kill reports it as still there. */
const KILL_WAIT_MS = 5000
const MAX_COMMAND_CHARS = 2000
const SECRET_FLAG = /key|token|secret|passw/i

export class OrphanService {
  readonly dataDir: string
  private readonly kills = new Map<string, Promise<KillResult>>()

  constructor(private readonly deps: OrphanDeps) {
    this.dataDir = resolve(deps.dataDir)
  }

  async list(): Promise<OrphanList> {
    const snapshot = await this.deps.probe.snapshot()
    const gpuByPid = gpuMemoryByPid(snapshot)
    const managed = this.managedSet()
    const found = new Map<number, Candidate>()
    for (const pid of listPids()) {
      const c = this.candidate(pid, gpuByPid, managed)
      if (c) found.set(pid, c.cand)
    }
    // Fold the engine processes of a group under its leader when the leader is listed itself.
    const entries = new Map<number, { lead: Candidate; members: Candidate[] }>()
    for (const c of found.values()) {
      const leader = c.info.pgid !== c.info.pid ? found.get(c.info.pgid) : undefined
      const key = leader ? leader.info.pid : c.info.pid
      const entry = entries.get(key) ?? { lead: leader ?? c, members: [] }
      entry.members.push(c)
      entries.set(key, entry)
    }
    const orphans = [...entries.values()]
      .map(({ lead, members }) => this.view(lead, members))
      .sort((a, b) => a.pid - b.pid)
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
    const managed = this.managedSet()
    if (this.isManaged(info, managed, this.marker(pid)))
      throw conflict(
        `pid ${pid} belongs to an engine this modelgate manages; unload its instance instead`,
        'ORPHAN_MANAGED',
      )
    if (info.startTime !== startTime)
      throw conflict(
        `pid ${pid} is now another process (start time ${info.startTime}, not ${startTime}); nothing was signalled`,
        'ORPHAN_CHANGED',
      )
    const c = this.candidate(pid, gpuMemoryByPid(snapshot), managed)
    if (!c)
      throw notFound(
        `pid ${pid} is not an orphan engine (no GPU memory, no engine command line)`,
        'ORPHAN_NOT_FOUND',
      )
    if (ancestorsOfSelf().has(pid))
      throw conflict(`pid ${pid} runs this modelgate (one of its parent processes)`, 'ORPHAN_NOT_PERMITTED')
    if (!maySignal(pid))
      throw conflict(`modelgate may not signal pid ${pid} (another user's process)`, 'ORPHAN_NOT_PERMITTED')
    const ownPgid = readProc(process.pid)?.pgid
    const command = shownCommand(info)
    // A group leader is stopped with its group, unless that group is this modelgate's own.
    const group = info.pgid === pid && pid !== ownPgid
    const targets = group ? [] : [info, ...descendants(pid)]
    const outcome = group
      ? await stopGroup(pid, this.deps.graceMs)
      : await stopTree(targets, this.deps.graceMs)
    const result: KillResult = {
      pid,
      start_time: startTime,
      stopped: !(isAlive(pid) && sameProcess(pid, startTime)),
      outcome,
      scope: group ? 'group' : 'tree',
      signalled_pids: targets.map((t) => t.pid),
    }
    this.deps.log.info(`orphan engine ${pid} stopped`, {
      by,
      outcome: result.outcome,
      scope: result.scope,
      stopped: result.stopped,
      command: command.slice(0, 300),
    })
    return result
  }

  private candidate(
    pid: number,
    gpuByPid: Map<number, Map<number, number>>,
    managed: ManagedSet,
  ): { cand: Candidate } | null {
    if (pid === process.pid) return null
    const info = readProc(pid)
    if (!info || info.state === 'Z') return null
    const reasons = new Set(engineReasons(info))
    const gpu = gpuByPid.get(pid) ?? new Map<number, number>()
    if (gpu.size > 0) reasons.add('gpu_memory')
    if (reasons.size === 0) return null
    if (this.isManaged(info, managed, this.marker(pid))) return null
    return { cand: { info, reasons, gpu } }
  }

  private managedSet(): ManagedSet {
    const set: ManagedSet = { pids: new Set(), pgids: new Set(), ids: new Set() }
    for (const m of this.deps.managed()) {
      set.ids.add(m.id)
      if (m.pid) set.pids.add(m.pid)
      if (m.pgid) set.pgids.add(m.pgid)
    }
    return set
  }

  private isManaged(info: ProcInfo, managed: ManagedSet, marker: OrphanMarker): boolean {
    if (managed.pids.has(info.pid) || managed.pgids.has(info.pgid)) return true
    return marker.this_data_dir && marker.instance_id !== null && managed.ids.has(marker.instance_id)
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

  private view(lead: Candidate, members: Candidate[]): Orphan {
    const gpu = new Map<number, number>()
    const reasons = new Set<OrphanReason>()
    for (const m of members) {
      for (const r of m.reasons) reasons.add(r)
      for (const [idx, mib] of m.gpu) gpu.set(idx, (gpu.get(idx) ?? 0) + mib)
    }
    const byGpu: Record<string, number> = {}
    for (const [idx, mib] of [...gpu].sort((a, b) => a[0] - b[0])) byGpu[String(idx)] = mib
    const info = lead.info
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
      marker: this.marker(info.pid),
      stop_scope: info.pgid === info.pid ? 'group' : 'tree',
      processes: members
        .map((m) => ({ pid: m.info.pid, process_name: m.info.comm, command: shownCommand(m.info) }))
        .sort((a, b) => a.pid - b.pid),
    }
  }
}

/** engineReasons: what in a process's name or command line says it is an inference engine. */
export function engineReasons(info: Pick<ProcInfo, 'comm' | 'argv'>): OrphanReason[] {
  const out: OrphanReason[] = []
  const argv = info.argv
  if (info.comm.startsWith('VLLM::') || (argv[0] ?? '').startsWith('VLLM::')) out.push('engine_process_name')
  const base = (s: string) => s.slice(s.lastIndexOf('/') + 1)
  // The program or the script an interpreter runs (index 0 or 1), so `grep vllm serve` is no engine.
  for (let i = 0; i <= 1 && i < argv.length; i++) {
    const a = argv[i] ?? ''
    if ((base(a) === 'vllm' && argv[i + 1] === 'serve') || a.startsWith('vllm.entrypoints')) {
      out.push('vllm_command')
      break
    }
  }
  if (!out.includes('vllm_command') && argv[1] === '-m' && (argv[2] ?? '').startsWith('vllm.entrypoints'))
    out.push('vllm_command')
  // modelgate's simulator: `modelgate sim engine …`, `bun src/main.ts sim engine …`.
  for (let i = 0; i <= 2 && i < argv.length; i++)
    if (argv[i] === 'sim' && argv[i + 1] === 'engine') {
      out.push('simulator')
      break
    }
  return out
}

/** shownCommand: the command line with the values of key/token/secret/password flags hidden. */
export function shownCommand(info: Pick<ProcInfo, 'comm' | 'argv'>): string {
  if (info.argv.length === 0) return `[${info.comm}]`
  const out: string[] = []
  for (let i = 0; i < info.argv.length; i++) {
    const a = info.argv[i] ?? ''
    if (a.startsWith('-') && SECRET_FLAG.test(a)) {
      const eq = a.indexOf('=')
      if (eq > 0) out.push(`${a.slice(0, eq)}=***`)
      else {
        out.push(a)
        if (i + 1 < info.argv.length && !(info.argv[i + 1] ?? '').startsWith('-')) {
          out.push('***')
          i++
        }
      }
    } else out.push(/\s/.test(a) || a === '' ? JSON.stringify(a) : a)
  }
  const s = out.join(' ')
  return s.length > MAX_COMMAND_CHARS ? `${s.slice(0, MAX_COMMAND_CHARS)}…` : s
}

/** gpuMemoryByPid: MiB per GPU index per pid, from nvidia-smi's compute apps. */
function gpuMemoryByPid(snapshot: GpuSnapshot): Map<number, Map<number, number>> {
  const out = new Map<number, Map<number, number>>()
  if (!snapshot.available) return out
  const indexOf = new Map(snapshot.gpus.map((g) => [g.uuid, g.index]))
  for (const app of snapshot.apps) {
    if (app.pid === null) continue
    const idx = indexOf.get(app.gpuUuid)
    if (idx === undefined) continue
    const m = out.get(app.pid) ?? new Map<number, number>()
    m.set(idx, (m.get(idx) ?? 0) + (app.usedMemoryMib ?? 0))
    out.set(app.pid, m)
  }
  return out
}

/** descendants: every live process below `pid` (by parent pid), read from /proc now. */
function descendants(pid: number): ProcInfo[] {
  const children = new Map<number, ProcInfo[]>()
  for (const p of listPids()) {
    const info = readProc(p)
    if (!info || info.state === 'Z') continue
    const list = children.get(info.ppid) ?? []
    list.push(info)
    children.set(info.ppid, list)
  }
  const out: ProcInfo[] = []
  const queue = [pid]
  const seen = new Set([pid])
  while (queue.length) {
    for (const c of children.get(queue.shift()!) ?? []) {
      if (seen.has(c.pid)) continue
      seen.add(c.pid)
      out.push(c)
      queue.push(c.pid)
    }
  }
  return out
}

/** ancestorsOfSelf: this process and its parents up to init (never to be signalled). */
function ancestorsOfSelf(): Set<number> {
  const out = new Set<number>()
  let pid = process.pid
  while (pid > 0 && !out.has(pid)) {
    out.add(pid)
    pid = readProc(pid)?.ppid ?? 0
  }
  return out
}

function maySignal(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code !== 'EPERM'
  }
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig)
  } catch {
    // gone meanwhile
  }
}

/**
 * stopTree: SIGTERM each target that is still the same process, wait up to `graceMs` for all to end,
 * then SIGKILL those still there (checked by start time again) and wait for them to vanish.
 */
async function stopTree(targets: ProcInfo[], graceMs: number): Promise<'terminated' | 'killed' | 'gone'> {
  const alive = () => targets.filter((t) => sameProcess(t.pid, t.startTime) && isAlive(t.pid))
  const first = alive()
  if (first.length === 0) return 'gone'
  for (const t of first) signal(t.pid, 'SIGTERM')
  if (await waitFor(() => alive().length === 0, graceMs)) return 'terminated'
  for (const t of alive()) signal(t.pid, 'SIGKILL')
  await waitFor(() => alive().length === 0, KILL_WAIT_MS)
  return 'killed'
}
