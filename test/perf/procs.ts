/**
 * The benchmarks' child processes: a server started as a process of its own that prints one JSON
 * line (`{url, pid}` or `{port, pid}`) once listening, and what /proc says of a process's CPU and
 * memory (Linux: USER_HZ = 100).
 */
import { readFileSync } from 'node:fs'
import type { Subprocess } from 'bun'

/**
 * spawnJson starts `argv` (its stderr passed through) and resolves with the first line it prints,
 * parsed; the process is added to `children`, which the caller stops on its way out.
 */
export function spawnJson<T = Record<string, unknown>>(
  argv: string[],
  children: Subprocess[],
  env: Record<string, string> = {},
): Promise<{ proc: Subprocess; info: T }> {
  const proc = Bun.spawn(argv, {
    stdout: 'pipe',
    stderr: 'inherit',
    stdin: 'ignore',
    env: { ...process.env, ...env },
  })
  children.push(proc)
  return (async () => {
    const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader()
    const { value } = await reader.read()
    reader.releaseLock()
    return { proc, info: JSON.parse(new TextDecoder().decode(value).split('\n')[0]!) as T }
  })()
}

/** cpuMs: user+system CPU of a process and its children (nginx workers), in ms. */
export function cpuMs(pid: number): number {
  let ticks = 0
  const pids = [pid]
  try {
    for (const c of readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/))
      if (c) pids.push(Number(c))
  } catch {}
  for (const p of pids) {
    try {
      const stat = readFileSync(`/proc/${p}/stat`, 'utf8')
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      ticks += Number(fields[11]) + Number(fields[12])
    } catch {}
  }
  return ticks * 10
}

/** rssMb: a process's resident memory, in MB. */
export function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return m ? Number(m[1]) / 1024 : Number.NaN
}
