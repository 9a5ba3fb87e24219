import { readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import type { Subprocess } from 'bun'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from './gateway.ts'
import { waitFor } from './wait.ts'

/**
 * Test support for modelgate pods as real processes: each pod is `bun src/main.ts serve --config
 * <file>` with its own data dir, its own simulated GPUs and its own engine port range, so a test can
 * `kill -9` one, `SIGSTOP` and `SIGCONT` it, as an operator's host would see it. The simulator's
 * engines are spawned by the pod in process groups of their own; they outlive a pod killed with -9
 * (as a real vLLM outlives its crashed gateway), so `kill()` and `stop()` also end every process
 * whose command line names the pod's sim dir.
 */
const BUN = process.execPath
const MAIN = resolve(import.meta.dir, '../../src/main.ts')

export interface PodProcessOptions {
  /** dir: the test's temp dir; the pod keeps its config, data, sim dir and logs under it. */
  dir: string
  id: string
  /** port: the pod's listener (fixed: its peers must know its address). */
  port: number
  /** enginePorts: the pod's engine port range (disjoint from every other pod's). */
  enginePorts: [number, number]
  /** gpus: the simulated GPUs, e.g. `2x80` (default). */
  gpus?: string
  /** cluster: the `plugins.cluster` section, indented by four spaces (absent: a single pod). */
  cluster?: string
  /** env: the pod's environment beside the test's (secrets, AUTH_MODE...). */
  env?: Record<string, string>
  /** simEnv: the simulated engine's environment (SIM_LOAD_DELAY_MS, SIM_TOKENS_PER_SEC...). */
  simEnv?: Record<string, string>
  logLevel?: string
}

const live = new Set<PodProcess>()
process.on('exit', () => {
  for (const p of live) p.killNow()
})

/** PodProcess: one running pod; `url` is its listener. */
export class PodProcess {
  readonly url: string
  readonly simDir: string
  readonly dataDir: string
  private readonly logFile: string
  private stopped = false

  private constructor(
    readonly id: string,
    readonly proc: Subprocess,
    o: PodProcessOptions,
  ) {
    this.url = `http://127.0.0.1:${o.port}`
    this.simDir = join(o.dir, `sim-${o.id}`)
    this.dataDir = join(o.dir, `data-${o.id}`)
    this.logFile = join(o.dir, `${o.id}.log`)
  }

  /** start writes the pod's config, spawns it and resolves once /api/health answers 200. */
  static async start(o: PodProcessOptions): Promise<PodProcess> {
    const config = join(o.dir, `${o.id}.yaml`)
    writeFileSync(config, podYaml(o))
    const proc = Bun.spawn([BUN, MAIN, 'serve', '--config', config], {
      env: { ...process.env, ...o.env },
      stdin: 'ignore',
      stdout: Bun.file(join(o.dir, `${o.id}.log`)),
      stderr: Bun.file(join(o.dir, `${o.id}.err`)),
    })
    const pod = new PodProcess(o.id, proc, o)
    live.add(pod)
    await waitFor(
      `pod ${o.id} to answer /api/health`,
      async () => {
        if (proc.exitCode !== null)
          throw new Error(`pod ${o.id} exited with ${proc.exitCode}: ${pod.output().slice(-2000)}`)
        const r = await fetch(`${pod.url}/api/health`, { signal: AbortSignal.timeout(1000) }).catch(
          () => null,
        )
        return r?.status === 200
      },
      { timeoutMs: 30_000, pollMs: 50 },
    )
    return pod
  }

  get pid(): number {
    return this.proc.pid
  }

  /** signal sends a signal to the pod process only (SIGSTOP, SIGCONT...). */
  signal(sig: NodeJS.Signals): void {
    process.kill(this.proc.pid, sig)
  }

  /** kill: `kill -9` of the pod and of its engines; resolves once the pod has exited. */
  async kill(): Promise<void> {
    this.killNow()
    await this.proc.exited
  }

  /** killNow: SIGKILL (after SIGCONT, in case it is stopped) to the pod and to its engines, synchronously. */
  killNow(): void {
    try {
      process.kill(this.proc.pid, 'SIGCONT')
      process.kill(this.proc.pid, 'SIGKILL')
    } catch {}
    killEngines(this.simDir)
    live.delete(this)
  }

  /** stop: SIGTERM and the pod's own clean shutdown (20 s), then SIGKILL; its engines end either way. */
  async stop(): Promise<void> {
    if (this.stopped) return
    this.stopped = true
    try {
      process.kill(this.proc.pid, 'SIGCONT')
      process.kill(this.proc.pid, 'SIGTERM')
    } catch {}
    const timer = setTimeout(() => this.killNow(), 20_000)
    await this.proc.exited
    clearTimeout(timer)
    killEngines(this.simDir)
    live.delete(this)
  }

  /** output: the pod's log so far (stdout and stderr), for a failure message. */
  output(): string {
    const read = (f: string) => {
      try {
        return readFileSync(f, 'utf8')
      } catch {
        return ''
      }
    }
    return read(this.logFile) + read(this.logFile.replace(/\.log$/, '.err'))
  }
}

function podYaml(o: PodProcessOptions): string {
  const sim = join(o.dir, `sim-${o.id}`)
  const gpus = o.gpus ?? '2x80'
  const simEnv = { SIM_LOAD_DELAY_MS: '300', SIM_TOKENS_PER_SEC: '200', ...o.simEnv }
  return `
server: { host: 127.0.0.1, port: ${o.port} }
data_dir: ${join(o.dir, `data-${o.id}`)}
log: { level: ${o.logLevel ?? 'info'} }
shutdown: { timeout_ms: 15000, drain_ms: 2000 }
plugins:
  gateway:
    engine:
      command: ['@self', sim, engine, --sim-dir, '${sim}', --sim-gpus, '${gpus}']
      env: ${JSON.stringify(simEnv)}
      port_range: { start: ${o.enginePorts[0]}, end: ${o.enginePorts[1]} }
      startup_timeout_seconds: 30
      stop_grace_seconds: 3
    gpu:
      smi_command: ['@self', sim, smi, --sim-dir, '${sim}', --sim-gpus, '${gpus}']
      cache_ms: 0
${o.cluster ? `  cluster:\n${o.cluster}` : ''}
`
}

/** killEngines SIGKILLs every process (and its group) whose command line names `simDir`. */
export function killEngines(simDir: string): void {
  let pids: string[] = []
  try {
    pids = readdirSync('/proc').filter((d) => /^\d+$/.test(d))
  } catch {
    return
  }
  for (const pid of pids) {
    let cmd = ''
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8')
    } catch {
      continue
    }
    if (!cmd.includes(simDir)) continue
    for (const target of [-Number(pid), Number(pid)])
      try {
        process.kill(target, 'SIGKILL')
      } catch {}
  }
}

/**
 * startStaticPods: gateway pods in one `static` cluster, the first named leading, each on a port of
 * its own (its advertised address) with its engines' ports from `enginePortBase + 10 × i`, sharing
 * `secret` as the cluster secret beside `hostEnv`. The caller stops them.
 */
export async function startStaticPods(o: {
  ids: readonly string[]
  enginePortBase: number
  hostEnv: Record<string, string>
  secret: string
}): Promise<TestGateway[]> {
  const ports: number[] = []
  for (const _ of o.ids) ports.push(await freePort())
  const peers = o.ids.map((id, i) => `{ pod_id: ${id}, address: 'http://127.0.0.1:${ports[i]}' }`).join(', ')
  const pods: TestGateway[] = []
  for (const [i, id] of o.ids.entries())
    pods.push(
      await startGateway({
        ports: [o.enginePortBase + i * 10, o.enginePortBase + 9 + i * 10],
        hostEnv: { ...o.hostEnv, CLUSTER_SECRET: o.secret },
        server: { port: ports[i]! },
        extraYaml: [
          '  cluster:',
          `    pod_id: ${id}`,
          `    advertise_address: http://127.0.0.1:${ports[i]}`,
          `    expected_size: ${o.ids.length}`,
          '    coordination:',
          '      kind: static',
          `      static: { leader: ${o.ids[0]}, peers: [${peers}] }`,
          '',
        ].join('\n'),
      }),
    )
  return pods
}
