/**
 * The benchmarks' child processes: a server started as a process of its own that prints one JSON
 * line (`{url, pid}` or `{port, pid}`) once listening, and what /proc says of a process's CPU and
 * memory (Linux: USER_HZ = 100).
 */
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { abortable } from '../../src/host/abortable.ts'

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

/** LoadRun: what proxy-load.ts prints (latencies in µs). */
export interface LoadRun {
  requests: number
  errors: number
  rps: number
  p50_us: number
  p99_us: number
}

/**
 * proxyLoad runs the non-streaming load generator (proxy-load.ts: `concurrency` keep-alive
 * connections posting one chat back to back for `ms`, each request with `headers`) in a process of
 * its own, and resolves with what it measured.
 */
export async function proxyLoad(
  url: string,
  concurrency: number,
  ms: number,
  headers: Record<string, string> = {},
): Promise<LoadRun> {
  const p = Bun.spawn(
    [
      process.execPath,
      join(import.meta.dir, 'proxy-load.ts'),
      '--url',
      url,
      '--concurrency',
      String(concurrency),
      '--duration-ms',
      String(ms),
      ...headerArgs(headers),
    ],
    { stdout: 'pipe', stderr: 'inherit', env: { ...process.env, BUN_CONFIG_MAX_HTTP_REQUESTS: '8192' } },
  )
  const out = await new Response(p.stdout).text()
  await p.exited
  return JSON.parse(out.trim().split('\n').pop()!) as LoadRun
}

/** headerArgs: `--header 'name: value'` for each header, for the load generators. */
export function headerArgs(headers: Record<string, string>): string[] {
  return Object.entries(headers).flatMap(([n, v]) => ['--header', `${n}: ${v}`])
}

/** stopAll: SIGTERM to every child, SIGKILL to those not gone within 3 s (a deadline, not a wait). */
export async function stopAll(children: Subprocess[]): Promise<void> {
  for (const c of children) c.kill('SIGTERM')
  await abortable(Promise.all(children.map((c) => c.exited)), {
    timeoutMs: 3000,
    what: 'the children to exit',
  }).catch(() => {})
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL')
}
