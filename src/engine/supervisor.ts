import { closeSync, mkdirSync, openSync } from 'node:fs'
import { dirname } from 'node:path'
import { FileTail } from './log-tail.ts'
import { groupAlive, isAlive, processStartTime, signalGroup, stopGroup } from './process.ts'

/**
 * EngineProcess is one engine's process group: spawned detached (its own session and group, so a
 * signal reaches vLLM's workers too) with stdout and stderr written to log files that are tailed,
 * or re-adopted after a modelgate restart from its recorded pid and start time.
 */
export type LogStream = 'stdout' | 'stderr'

export interface EngineLogFiles {
  stdout: string
  stderr: string
}

export interface SpawnOptions {
  argv: string[]
  env: Record<string, string | undefined>
  logs: EngineLogFiles
  onLine(stream: LogStream, line: string): void
}

export class EngineProcess {
  readonly exited: Promise<number | null>
  private tails: FileTail[] = []
  private watch: ReturnType<typeof setInterval> | null = null
  private exitCode: number | null | undefined

  private constructor(
    readonly pid: number,
    readonly pgid: number,
    readonly startTime: string | null,
    exited: Promise<number | null>,
  ) {
    this.exited = exited.then((code) => {
      this.exitCode = code
      return code
    })
  }

  /** spawn starts the engine in its own process group with output going to log files. */
  static spawn(opts: SpawnOptions): EngineProcess {
    mkdirSync(dirname(opts.logs.stdout), { recursive: true })
    const out = openSync(opts.logs.stdout, 'a')
    const err = openSync(opts.logs.stderr, 'a')
    let proc: ReturnType<typeof Bun.spawn>
    try {
      proc = Bun.spawn(opts.argv, {
        env: opts.env,
        stdin: 'ignore',
        stdout: out,
        stderr: err,
        detached: true,
      })
    } finally {
      closeSync(out)
      closeSync(err)
    }
    const engine = new EngineProcess(proc.pid, proc.pid, processStartTime(proc.pid), proc.exited)
    engine.follow(opts.logs, opts.onLine, false)
    return engine
  }

  /**
   * adopt re-attaches to an engine from a previous run. It is only called after the caller checked
   * pid and start time; exit is detected by polling since it is not our child any more.
   */
  static adopt(
    pid: number,
    pgid: number,
    startTime: string,
    logs: EngineLogFiles,
    onLine: (stream: LogStream, line: string) => void,
  ): EngineProcess {
    let resolveExit: (code: number | null) => void = () => {}
    const exited = new Promise<number | null>((r) => {
      resolveExit = r
    })
    const engine = new EngineProcess(pid, pgid, startTime, exited)
    engine.watch = setInterval(() => {
      if (!isAlive(pid) || processStartTime(pid) !== startTime) {
        if (engine.watch) clearInterval(engine.watch)
        engine.watch = null
        resolveExit(null)
      }
    }, 500)
    engine.follow(logs, onLine, true)
    return engine
  }

  private follow(logs: EngineLogFiles, onLine: (s: LogStream, l: string) => void, fromEnd: boolean): void {
    for (const stream of ['stdout', 'stderr'] as const) {
      try {
        this.tails.push(new FileTail(logs[stream], (line) => onLine(stream, line), { fromEnd }))
      } catch {
        // the log file is gone (e.g. data_dir cleaned): run without logs rather than fail
      }
    }
  }

  get running(): boolean {
    return this.exitCode === undefined
  }

  /** flushLogs delivers every line written so far (used right after exit to catch the last words). */
  flushLogs(): void {
    for (const t of this.tails) t.poll()
  }

  /** stop: TERM the group, KILL after the grace period; resolves when the group is gone. */
  async stop(graceMs: number): Promise<'gone' | 'terminated' | 'killed'> {
    const how = await stopGroup(this.pgid, graceMs)
    this.close()
    return how
  }

  /** kill is the synchronous last resort: SIGKILL the whole group. */
  kill(): void {
    if (groupAlive(this.pgid)) signalGroup(this.pgid, 'SIGKILL')
  }

  /** close stops following logs and watching the pid. */
  close(): void {
    if (this.watch) clearInterval(this.watch)
    this.watch = null
    for (const t of this.tails) t.stop()
    this.tails = []
  }
}
