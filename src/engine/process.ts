import { readdirSync, readFileSync } from 'node:fs'

/**
 * Process helpers for engine supervision: start-time identity (so a reused pid is never signalled)
 * and process-group signalling (vLLM spawns workers; signalling the leader alone orphans them).
 */

/** statFields: the fields of /proc/<pid>/stat after comm (state first), or null if gone. */
function statFields(pid: number): string[] | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // comm (field 2) may contain spaces and parentheses: split after the last ')'.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  } catch {
    return null
  }
}

/** processStartTime reads field 22 of /proc/<pid>/stat (clock ticks since boot), or null if gone. */
export function processStartTime(pid: number): string | null {
  return statFields(pid)?.[19] ?? null
}

/** isAlive tells whether a pid exists (a zombie counts as gone). */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM'
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z'
  } catch {
    return true
  }
}

/** groupAlive tells whether any process of a group still exists (`kill(-pgid, 0)`). */
export function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM'
  }
}

/** signalGroup sends a signal to a whole process group; false when the group is gone. */
export function signalGroup(pgid: number, signal: NodeJS.Signals): boolean {
  try {
    process.kill(-pgid, signal)
    return true
  } catch {
    return false
  }
}

/**
 * sameProcess: the pid is alive and its start time is the one we recorded (no pid reuse). A zombie is
 * not alive: an engine that died and waits for its parent (or an init slow to reap) to collect it.
 */
export function sameProcess(pid: number, startTime: string | null): boolean {
  if (!startTime) return false
  const fields = statFields(pid)
  return fields !== null && fields[0] !== 'Z' && fields[19] === startTime
}

/** waitFor polls `check` until it returns true or the deadline passes. */
export async function waitFor(check: () => boolean, timeoutMs: number, intervalMs = 50): Promise<boolean> {
  const until = Date.now() + timeoutMs
  while (Date.now() < until) {
    if (check()) return true
    await Bun.sleep(intervalMs)
  }
  return check()
}

/**
 * stopGroup: SIGTERM the group, wait up to `graceMs`, then SIGKILL the group and wait for it to
 * vanish. Returns how it ended.
 */
export async function stopGroup(pgid: number, graceMs: number): Promise<'gone' | 'terminated' | 'killed'> {
  if (!groupAlive(pgid)) return 'gone'
  signalGroup(pgid, 'SIGTERM')
  if (await waitFor(() => !groupAlive(pgid), graceMs)) return 'terminated'
  signalGroup(pgid, 'SIGKILL')
  await waitFor(() => !groupAlive(pgid), 5000)
  return 'killed'
}

/** ProcessRef: a process as it was seen, by pid and start time (a pid alone may be reused). */
export interface ProcessRef {
  pid: number
  startTime: string
}

/**
 * stopProcesses: SIGTERM every process `remaining()` returns, wait up to `graceMs` for it to return
 * none, then SIGKILL those it still returns and wait for them to vanish. `remaining` reads /proc again
 * each time and returns only the processes still meant (same pid and start time), and each is checked
 * once more right before its signal, so a pid reused meanwhile is never signalled. This is the stop for
 * processes whose group id no longer proves who they are (their group leader is gone), and for the
 * processes an admin was shown, where a signal to the whole group could reach one never shown.
 */
export async function stopProcesses(
  remaining: () => ProcessRef[],
  graceMs: number,
): Promise<'gone' | 'terminated' | 'killed'> {
  const first = remaining()
  if (first.length === 0) return 'gone'
  for (const p of first) signalProcess(p, 'SIGTERM')
  if (await waitFor(() => remaining().length === 0, graceMs)) return 'terminated'
  for (const p of remaining()) signalProcess(p, 'SIGKILL')
  await waitFor(() => remaining().length === 0, 5000)
  return 'killed'
}

function signalProcess(p: ProcessRef, signal: NodeJS.Signals): void {
  if (processStartTime(p.pid) !== p.startTime) return
  try {
    process.kill(p.pid, signal)
  } catch {
    // gone meanwhile
  }
}

/** groupPids lists the live pids whose process group is `pgid` (vLLM's GPU memory sits in workers). */
export function groupPids(pgid: number): number[] {
  const out: number[] = []
  let entries: string[]
  try {
    entries = readdirSync('/proc')
  } catch {
    return [pgid]
  }
  for (const name of entries) {
    if (name.charCodeAt(0) < 48 || name.charCodeAt(0) > 57) continue
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8')
      const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      if (Number(rest[2]) === pgid) out.push(Number(name))
    } catch {
      // raced with exit
    }
  }
  return out.length ? out : [pgid]
}
