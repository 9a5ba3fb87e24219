import { readdirSync, readFileSync } from 'node:fs'

/**
 * Process helpers for engine supervision: start-time identity (so a reused pid is never signalled)
 * and process-group signalling (vLLM spawns workers; signalling the leader alone orphans them).
 */

/** processStartTime reads field 22 of /proc/<pid>/stat (clock ticks since boot), or null if gone. */
export function processStartTime(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // comm (field 2) may contain spaces and parentheses: split after the last ')'.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return rest[19] ?? null
  } catch {
    return null
  }
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

/** sameProcess: the pid is alive and its start time is the one we recorded (no pid reuse). */
export function sameProcess(pid: number, startTime: string | null): boolean {
  if (!startTime) return false
  return processStartTime(pid) === startTime
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
