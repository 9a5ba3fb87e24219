import { readdirSync, readFileSync } from 'node:fs'

/**
 * What /proc tells about a process, read without ever throwing: a process that exits while it is read
 * is simply absent, and a file another user's process keeps from us (environ) is "unreadable".
 */
export interface ProcInfo {
  pid: number
  ppid: number
  pgid: number
  /** comm: the kernel's process name (15 characters; vLLM's children set it to `VLLM::EngineCor…`). */
  comm: string
  /** state: R, S, D, Z, T, … */
  state: string
  /** startTime: field 22 of /proc/<pid>/stat (clock ticks since boot), as src/engine/process.ts reads it. */
  startTime: string
  argv: string[]
}

export function readProc(pid: number): ProcInfo | null {
  let stat: string
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  } catch {
    return null
  }
  const open = stat.indexOf('(')
  const close = stat.lastIndexOf(')')
  if (open < 0 || close < open) return null
  const rest = stat.slice(close + 2).split(' ')
  const startTime = rest[19]
  if (startTime === undefined) return null
  let argv: string[] = []
  try {
    argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')
    if (argv.at(-1) === '') argv.pop()
  } catch {
    // gone or hidden: keep the empty argv
  }
  return {
    pid,
    ppid: Number(rest[1]),
    pgid: Number(rest[2]),
    comm: stat.slice(open + 1, close),
    state: rest[0] ?? '?',
    startTime,
    argv,
  }
}

/** listPids: every numeric entry of /proc. */
export function listPids(): number[] {
  let names: string[]
  try {
    names = readdirSync('/proc')
  } catch {
    return []
  }
  const out: number[] = []
  for (const n of names) if (/^\d+$/.test(n)) out.push(Number(n))
  return out
}

/**
 * readEnvVars returns the wanted variables of a process's environment, or null when it cannot be
 * read (another user's process, a hardened /proc, or gone). Nothing else of the environment leaves here.
 */
export function readEnvVars(pid: number, names: readonly string[]): Record<string, string> | null {
  let text: string
  try {
    text = readFileSync(`/proc/${pid}/environ`, 'utf8')
  } catch {
    return null
  }
  const out: Record<string, string> = {}
  for (const entry of text.split('\0')) {
    const eq = entry.indexOf('=')
    if (eq <= 0) continue
    const name = entry.slice(0, eq)
    if (names.includes(name)) out[name] = entry.slice(eq + 1)
  }
  return out
}

let bootSeconds: number | null | undefined

/**
 * startedAt turns a /proc start time into an ISO timestamp: boot time (`btime` of /proc/stat) plus the
 * ticks at USER_HZ = 100, which Linux uses on every mainstream architecture. null when unknown.
 */
export function startedAt(startTime: string): string | null {
  if (bootSeconds === undefined) {
    try {
      const m = /^btime (\d+)$/m.exec(readFileSync('/proc/stat', 'utf8'))
      bootSeconds = m ? Number(m[1]) : null
    } catch {
      bootSeconds = null
    }
  }
  const ticks = Number(startTime)
  if (bootSeconds === null || !Number.isFinite(ticks)) return null
  return new Date((bootSeconds + ticks / 100) * 1000).toISOString()
}
