import type { Server } from 'bun'
import { type EngineChild, killEngineChildren } from './children.ts'
import { engineFetch } from './engine-api.ts'
import { bootEngine, StartFailure, Stopped } from './engine-boot.ts'
import { VLLM_VERSION } from './engine-logs.ts'
import type { SimGpu } from './gpus.ts'
import { readKnobs, type SimKnobs } from './knobs.ts'
import { KVCACHED_PREALLOC_MIB, type KvcachedSegment } from './kvcached.ts'
import { type MemoryPlan, nonKvMib, planMemory } from './memory-plan.ts'
import { EngineMetrics } from './metrics.ts'
import { lookupModel, type ModelSpec } from './models.ts'
import { crashTraceback, engineDead } from './python-errors.ts'
import type { EngineRuntime, LiveRequest } from './runtime.ts'
import { Scheduler } from './scheduler.ts'
import { SleepState, type SleepTag } from './sleep-state.ts'
import { removeEngineRecord, writeEngineRecord } from './state.ts'
import { FakeTokenizer } from './tokenizer.ts'
import type { VllmArgs } from './vllm-args.ts'
import { processSink, VllmLog } from './vllm-log.ts'

/**
 * SimEngine is one simulated `vllm serve` process: it boots through vLLM's start-up stages (see
 * engine-boot.ts), serves the HTTP API, keeps its footprint in the shared state directory, sleeps and
 * wakes, and ends on SIGTERM/SIGINT (cleanly, exit 0) or on an injected crash (abruptly, exit 1).
 */
export class SimEngine implements EngineRuntime {
  readonly knobs: SimKnobs
  readonly log: VllmLog
  readonly tags = { api: '', core: '' }
  readonly model: ModelSpec
  plan: MemoryPlan
  maxModelLen: number
  readonly createdAt = Math.floor(Date.now() / 1000)
  readonly version: string
  readonly tokenizer = new FakeTokenizer()
  scheduler: Scheduler
  readonly sleep = new SleepState()
  readonly metrics: EngineMetrics
  dying = false
  phase: 'init' | 'weights' | 'ready' = 'init'
  usedGpus: number[] = []
  children: EngineChild[] = []
  kvSegment: KvcachedSegment | undefined
  server: Server<unknown> | undefined
  readonly lifetime = new AbortController()
  private readonly live = new Set<LiveRequest>()
  private readonly timers: ReturnType<typeof setInterval>[] = []
  private readonly exit = Promise.withResolvers<number>()
  private readonly startedAt = new Date().toISOString()
  private tokensEmitted = 0
  private lastRecord = ''
  private readonly onTerm = () => {
    if (!this.knobs.hangOnTerm) void this.stop(0)
  }
  private readonly onInt = () => void this.stop(0)

  constructor(
    readonly args: VllmArgs,
    env: NodeJS.ProcessEnv,
    readonly simDir: string,
    readonly gpus: SimGpu[],
  ) {
    this.knobs = readKnobs(env)
    this.log = new VllmLog(this.knobs.logAnsi)
    this.version = VLLM_VERSION[this.knobs.logStyle]
    this.model = lookupModel(args.model)
    this.maxModelLen = this.model.maxModelLen
    this.metrics = new EngineMetrics(args.servedModelNames[0] ?? args.model)
    this.plan = planMemory(this.model, gpus[0]?.totalMib ?? 81559, 0.9, 1, this.maxModelLen)
    this.scheduler = new Scheduler(1, 0, () => false)
    if (this.knobs.logStyle === 'v1') this.tags.api = `(APIServer pid=${process.pid})`
  }

  async run(): Promise<number> {
    process.on('SIGTERM', this.onTerm)
    process.on('SIGINT', this.onInt)
    bootEngine(this).catch((err: unknown) => {
      if (err instanceof Stopped) return
      if (err instanceof StartFailure) return void this.stop(err.code)
      this.log.error(this.tags.api, 'api_server.py:1920', String((err as Error)?.stack ?? err))
      void this.stop(1)
    })
    return this.exit.promise
  }

  /** delay is an abortable wait: shutdown during start-up rejects it with Stopped. */
  delay(ms: number): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.lifetime.signal.aborted) return reject(new Stopped())
      const timer = setTimeout(resolve, ms)
      this.lifetime.signal.addEventListener('abort', () => {
        clearTimeout(timer)
        reject(new Stopped())
      })
    })
  }

  /** ready wires the runtime once the memory plan is final, then serves. */
  startServing(): void {
    const maxNumSeqs = this.args.maxNumSeqs ?? (this.plan.deviceTotalGiB >= 70 ? 1024 : 256)
    this.scheduler = new Scheduler(maxNumSeqs, this.plan.kvTokens, () => !this.sleep.sleeping && !this.dying)
    this.server = Bun.serve({
      hostname: this.args.host,
      port: this.args.port,
      idleTimeout: 120,
      development: false,
      fetch: engineFetch(this),
      error: (err) =>
        Response.json(
          { error: { message: err.message, type: 'InternalServerError', param: null, code: 500 } },
          { status: 500 },
        ),
    })
    this.timers.push(setInterval(() => this.writeRecord(), 250))
    if (!this.args.disableLogStats) {
      this.timers.push(
        setInterval(() => {
          const live = {
            running: this.scheduler.running.size,
            waiting: this.scheduler.numWaiting,
            kvUsage: this.scheduler.kvUsage(),
          }
          const line = this.metrics.statsLine(live)
          if (line) this.log.info(this.tags.api, 'loggers.py:123', line)
        }, 10_000),
      )
    }
  }

  /** keepAlive holds the process open (SIM_HANG) until a signal arrives. */
  keepAlive(): void {
    this.timers.push(setInterval(() => {}, 60_000))
  }

  footprintMib(): number {
    if (this.phase === 'init') return 0
    if (this.phase === 'weights') return this.plan.weightsMib
    const inflightMib = (this.scheduler.usedTokens * this.plan.kvBytesPerTokenPerRank) / 2 ** 20
    const awake = this.kvSegment
      ? Math.round(nonKvMib(this.plan) + KVCACHED_PREALLOC_MIB + inflightMib)
      : this.plan.budgetMib
    return this.sleep.footprintMib(awake, this.plan.weightsMib)
  }

  /** writeRecord publishes our footprint (only when it changed) for the smi simulator. */
  writeRecord(): void {
    if (this.phase === 'init' || this.dying) return
    const running = this.scheduler.running.size
    const record = {
      pid: process.pid,
      gpus: this.usedGpus,
      used_mib_per_gpu: this.footprintMib(),
      process_name: 'python3',
      model: this.args.model,
      started_at: this.startedAt,
      running,
      busy: running > 0,
      sleeping: this.sleep.sleeping,
      port: this.args.port,
    }
    const json = JSON.stringify(record)
    if (json !== this.lastRecord) {
      this.lastRecord = json
      writeEngineRecord(this.simDir, record)
    }
    this.kvSegment?.setUsed(this.scheduler.usedTokens * this.plan.kvBytesPerTokenPerRank)
  }

  register(handle: LiveRequest): () => void {
    this.live.add(handle)
    return () => this.live.delete(handle)
  }

  countToken(): void {
    this.tokensEmitted++
    const limit = this.knobs.crashAfterTokens
    if (limit !== undefined && this.tokensEmitted >= limit) {
      this.crash('RuntimeError: CUDA error: an illegal memory access was encountered')
    }
  }

  crash(error: string): void {
    if (this.dying) return
    this.dying = true
    this.log.error(this.tags.core, 'core.py:710', 'EngineCore encountered a fatal error.')
    processSink.syncStderr(`${crashTraceback(error).join('\n')}\n`)
    this.log.error(this.tags.api, 'async_llm.py:480', 'AsyncLLM output_handler failed.')
    processSink.syncStderr(`${engineDead()}\n`)
    if (this.knobs.crashMode === 'error') {
      for (const r of [...this.live])
        r.fail('EngineCore encountered an issue. See stack trace (above) for the root cause.')
    }
    for (const c of this.children) c.proc.kill('SIGKILL')
    setTimeout(() => process.exit(1), this.knobs.crashMode === 'error' ? 60 : 20)
  }

  async sleepEngine(level: 1 | 2): Promise<void> {
    if (this.sleep.sleeping) return
    const t0 = performance.now()
    const before = this.footprintMib()
    await this.delay(Math.min(50, this.knobs.wakeDelayMs / 6))
    this.sleep.sleep(level)
    this.writeRecord()
    const after = this.footprintMib()
    const gib = (mib: number) => (mib / 1024).toFixed(2)
    this.log.info(
      this.tags.core,
      'gpu_worker.py:117',
      `Sleep mode freed ${gib(before - after)} GiB memory, ${gib(after)} GiB memory is still in use.`,
    )
    this.log.info(
      this.tags.core,
      'executor_base.py:203',
      `It took ${((performance.now() - t0) / 1000).toFixed(6)} seconds to fall asleep.`,
    )
  }

  async wakeEngine(tags: SleepTag[]): Promise<void> {
    if (!tags.some((t) => this.sleep.isAsleep(t))) return
    const t0 = performance.now()
    await this.delay(this.sleep.level === 2 ? this.knobs.wakeDelayMs : this.knobs.wakeDelayMs / 3)
    this.sleep.wake(tags)
    this.writeRecord()
    this.scheduler.pump()
    const list = `[${tags.map((t) => `'${t}'`).join(', ')}]`
    this.log.info(
      this.tags.core,
      'executor_base.py:219',
      `It took ${((performance.now() - t0) / 1000).toFixed(6)} seconds to wake up tags ${list}.`,
    )
  }

  /** stop is the one exit path for handled ends (signal, start-up failure); it is idempotent. */
  async stop(code: number): Promise<void> {
    if (this.lifetime.signal.aborted) return
    this.lifetime.abort()
    const server = this.server
    if (server) this.log.stderr('INFO:     Shutting down')
    this.dying = true
    for (const r of [...this.live]) r.cancel()
    this.scheduler.clear()
    for (const t of this.timers) clearInterval(t)
    void server?.stop(true)
    removeEngineRecord(this.simDir, process.pid)
    this.kvSegment?.remove()
    await killEngineChildren(this.children)
    if (server) {
      this.log.stderr(
        'INFO:     Waiting for application shutdown.',
        'INFO:     Application shutdown complete.',
        `INFO:     Finished server process [${process.pid}]`,
      )
    }
    process.off('SIGTERM', this.onTerm)
    process.off('SIGINT', this.onInt)
    this.exit.resolve(code)
    // Safety net: nothing should keep the process alive after a handled exit.
    setTimeout(() => process.exit(code), 300).unref()
  }
}
