import type { Server } from 'bun'
import { type EngineChild, killEngineChildren } from './children.ts'
import { engineFetch } from './engine-api.ts'
import { bootEngine, StartFailure, Stopped } from './engine-boot.ts'
import type { SimGpu } from './gpus.ts'
import { readKnobs, type SimKnobs } from './knobs.ts'
import { KVCACHED_PREALLOC_MIB, type KvcachedSegment } from './kvcached.ts'
import { type MemoryPlan, nonKvMib, planMemory, pyRound } from './memory-plan.ts'
import { EngineMetrics } from './metrics.ts'
import { lookupModel, type ModelSpec } from './models.ts'
import { crashTraceback, ENGINE_DEAD_MESSAGE, engineDead } from './python-errors.ts'
import type { EngineRuntime, LiveRequest } from './runtime.ts'
import { Scheduler, type Sequence } from './scheduler.ts'
import { type PauseMode, type SleepFrees, SleepState, type SleepTag } from './sleep-state.ts'
import {
  type EngineApp,
  readLiveEngines,
  removeEngineRecord,
  usedMibOnGpu,
  writeEngineRecord,
} from './state.ts'
import { FakeTokenizer } from './tokenizer.ts'
import type { VllmArgs } from './vllm-args.ts'
import { processSink, VllmLog } from './vllm-log.ts'

/**
 * SimEngine is one simulated `vllm serve` process: it boots through vLLM's start-up stages (see
 * engine-boot.ts), serves the HTTP API, keeps its footprint in the shared state directory (held, as
 * nvidia-smi shows it, by its EngineCore / Worker_TPn child processes), sleeps and wakes as the
 * imitated vLLM release does (versions.ts: `mode=abort|wait|keep`, level 2 discarding the weights
 * until `reload_weights`, sleeps that free little), and ends on SIGTERM/SIGINT (cleanly, exit 0) or on
 * an injected crash (abruptly, exit 1). When its engine-core child dies the API server lives on with
 * `/health` at 503, until a request meets the dead engine (then it shuts down, unless
 * VLLM_KEEP_ALIVE_ON_ENGINE_DEATH).
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
  engineDead = false
  phase: 'init' | 'weights' | 'ready' = 'init'
  usedGpus: number[] = []
  children: EngineChild[] = []
  workerTags: string[] = []
  kvSegment: KvcachedSegment | undefined
  server: Server<unknown> | undefined
  readonly lifetime = new AbortController()
  private readonly live = new Set<LiveRequest>()
  /** Requests a `mode=wait` sleep lets finish, and its wake-up once they have. */
  private drainSet: Set<LiveRequest> | undefined
  private drained: (() => void) | undefined
  private runWaiters: (() => void)[] = []
  /** Sleep, wake and weight reloads run one at a time, as utility calls in vLLM's engine core. */
  private control: Promise<unknown> = Promise.resolve()
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
    this.version = this.knobs.profile.version
    this.model = lookupModel(args.model)
    this.maxModelLen = this.model.maxModelLen
    this.metrics = new EngineMetrics(
      args.servedModelNames[0] ?? args.model,
      this.knobs.profile.sleepStateMetric,
    )
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
    this.scheduler = new Scheduler(maxNumSeqs, this.plan.kvTokens, (seq) => this.canRun(seq))
    // reusePort is explicit: Bun.serve turns SO_REUSEPORT on by itself when `development` is false,
    // which would let any number of engines share a port whatever the imitated vLLM does.
    this.server = Bun.serve({
      hostname: this.args.host,
      port: this.args.port,
      reusePort: this.knobs.profile.reusePort,
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

  get workerCount(): number {
    return Math.max(1, this.args.tensorParallelSize)
  }

  /** gpuApps: the processes holding our memory, one per GPU (engine core, or one worker per TP rank). */
  private gpuApps(): EngineApp[] | undefined {
    if (this.children.length === 0) return undefined
    const v0 = this.knobs.logStyle === 'v0'
    const holders = this.usedGpus.length > 1 ? this.children.slice(1) : this.children.slice(0, 1)
    if (holders.length < this.usedGpus.length) return undefined
    return this.usedGpus.map((gpu, i) => ({
      pid: holders[i]?.pid ?? process.pid,
      gpu,
      process_name: v0 ? 'python3' : (holders[i]?.processName ?? 'python3'),
    }))
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
      apps: this.gpuApps(),
      model: this.args.model,
      started_at: this.startedAt,
      running,
      busy: running > 0,
      sleeping: this.sleep.executorAsleep,
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
    return () => {
      this.live.delete(handle)
      if (this.drainSet?.delete(handle) && this.drainSet.size === 0) this.drained?.()
    }
  }

  /**
   * canRun: a request may be admitted or emit unless the engine is going down, its released memory
   * is not back, or its scheduler is paused (`new`: only the requests a `wait` sleep drains; `all`:
   * none, a `keep` sleep).
   */
  canRun(seq: Sequence): boolean {
    if (this.dying) return false
    if (this.sleep.blocksInference) return false
    if (this.sleep.paused === 'all') return false
    if (this.sleep.paused === 'new') return this.drainSet?.has(seq.owner as LiveRequest) ?? false
    return true
  }

  whenRunnable(cb: () => void): void {
    this.runWaiters.push(cb)
  }

  /** kick lets waiting generations and queued requests re-check canRun after a wake or resume. */
  private kick(): void {
    const waiters = this.runWaiters
    this.runWaiters = []
    for (const w of waiters) w()
    this.scheduler.pump()
  }

  /** serialized runs sleep / wake / reload one after the other. */
  private serialized<T>(op: () => Promise<T>): Promise<T> {
    const next = this.control.then(op, op)
    this.control = next.catch(() => {})
    return next
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
      for (const r of [...this.live]) r.fail(ENGINE_DEAD_MESSAGE)
    }
    for (const c of this.children) c.proc.kill('SIGKILL')
    setTimeout(() => process.exit(1), this.knobs.crashMode === 'error' ? 60 : 20)
  }

  /**
   * sleepFrees: what this engine's sleep really releases (see SleepFrees). A kvcached engine's KV
   * pages are kvcached's, outside the sleep allocator: its sleep releases the weights at most.
   */
  private sleepFrees(): SleepFrees {
    if (!this.args.enableSleepMode) return 'nothing'
    if (this.kvSegment) return this.knobs.sleepKeepsWeights ? 'nothing' : 'weights'
    return this.knobs.sleepKeepsWeights ? 'kv_cache' : 'all'
  }

  private gib(mib: number): string {
    const gib = mib / 1024
    return this.knobs.profile.sleepFiguresRounded ? pyRound(gib) : gib.toFixed(2)
  }

  /**
   * sleepEngine is `POST /sleep`. Newer engines first pause the scheduler by `mode` (`abort`: every
   * request in the engine ends with finish_reason "abort"; `wait`: the requests already in the
   * engine run to the end while new ones queue; `keep`: all are frozen until the wake-up), then
   * release memory (level ≥ 1). Older engines ignore `mode`: their requests stall until the wake-up
   * (or, with SIM_SLEEP_INFERENCE=crash, kill the engine as real old builds do).
   */
  sleepEngine(level: 0 | 1 | 2, mode: PauseMode): Promise<void> {
    const started = performance.now()
    return this.serialized(async () => {
      try {
        await this.fallAsleep(level, mode)
      } finally {
        if (this.knobs.profile.sleepComponents)
          this.metrics.recordOperation('sleep', (performance.now() - started) / 1000)
      }
    })
  }

  /**
   * releaseKvCache is current builds' `POST /release_kv_cache_memory`: the scheduler pauses (its
   * requests kept) and the KV cache alone is freed; the weights stay on the GPU.
   */
  releaseKvCache(): Promise<void> {
    const started = performance.now()
    return this.serialized(async () => {
      if (!this.sleep.executorAsleep) {
        await this.delay(Math.min(50, this.knobs.wakeDelayMs / 6))
        this.sleep.releaseKvCache()
        this.writeRecord()
      }
      this.metrics.recordOperation('release_kv_cache_memory', (performance.now() - started) / 1000)
    })
  }

  private async fallAsleep(level: 0 | 1 | 2, mode: PauseMode): Promise<void> {
    {
      if (this.knobs.profile.sleepModes) await this.pauseScheduler(mode)
      if (level === 0) {
        this.metrics.recordSleepState(1, 0)
        return
      }
      if (this.sleep.executorAsleep) {
        this.log.warning(this.tags.core, 'abstract.py:299', 'Executor is already sleeping.')
        return
      }
      const t0 = performance.now()
      const before = this.footprintMib()
      await this.delay(Math.min(50, this.knobs.wakeDelayMs / 6))
      this.sleep.sleep(level, this.sleepFrees())
      this.writeRecord()
      const after = this.footprintMib()
      const records = readLiveEngines(this.simDir)
      for (const [rank, gpu] of this.usedGpus.entries()) {
        const inUse = usedMibOnGpu(records, gpu, process.pid) + after
        this.log.info(
          this.workerTags[rank] ?? this.tags.core,
          this.knobs.logStyle === 'v0' ? 'worker.py:139' : 'gpu_worker.py:117',
          `Sleep mode freed ${this.gib(before - after)} GiB memory, ${this.gib(inUse)} GiB memory is still in use.`,
        )
      }
      this.log.info(
        this.tags.core,
        this.knobs.logStyle === 'v0' ? 'executor_base.py:203' : 'abstract.py:306',
        `It took ${((performance.now() - t0) / 1000).toFixed(6)} seconds to fall asleep.`,
      )
      this.metrics.recordSleepState(1, level)
    }
  }

  private async pauseScheduler(mode: PauseMode): Promise<void> {
    if (mode === 'keep') {
      this.sleep.paused = 'all'
      return
    }
    this.sleep.paused = 'new'
    if (mode === 'abort') {
      for (const r of [...this.live]) r.abort()
      return
    }
    const draining = new Set(this.live)
    if (draining.size === 0) return
    this.drainSet = draining
    await new Promise<void>((resolve) => {
      this.drained = resolve
    })
    this.drainSet = undefined
    this.drained = undefined
  }

  /**
   * wakeEngine is `POST /wake_up[?tags=…]`: the named parts (all when none) come back; newer engines
   * resume their scheduler on every wake-up call (`scheduling` is theirs, not the executor's), and
   * report themselves awake on /metrics. As vLLM's executor does, a tag that is not asleep (an
   * unknown one too) is a warning and wakes nothing at all; the call still succeeds.
   */
  wakeEngine(requested: string[] | undefined): Promise<void> {
    const started = performance.now()
    return this.serialized(async () => {
      const modes = this.knobs.profile.sleepModes
      const tags = requested?.filter((t) => !(modes && t === 'scheduling'))
      const memory = requested === undefined || (tags?.length ?? 0) > 0
      const notAsleep = tags?.find((t) => !this.sleep.isAsleep(t))
      if (memory && !this.sleep.executorAsleep) {
        this.log.warning(this.tags.core, 'abstract.py:314', 'Executor is not sleeping.')
      } else if (memory && notAsleep !== undefined) {
        const asleep = `{${this.sleep.asleepTags.map((t) => `'${t}'`).join(', ')}}`
        this.log.warning(
          this.tags.core,
          'abstract.py:318',
          `Tag ${notAsleep} is not in sleeping tags ${asleep}`,
        )
      } else if (memory) {
        const t0 = performance.now()
        const wake = (tags ?? ['weights', 'kv_cache']) as SleepTag[]
        await this.delay(this.sleep.level === 2 ? this.knobs.wakeDelayMs : this.knobs.wakeDelayMs / 3)
        this.sleep.wake(wake)
        this.writeRecord()
        const list = tags
          ? `[${tags.map((t) => `'${t}'`).join(', ')}]`
          : `{${wake.map((t) => `'${t}'`).join(', ')}}`
        this.log.info(
          this.tags.core,
          this.knobs.logStyle === 'v0' ? 'executor_base.py:219' : 'abstract.py:324',
          `It took ${((performance.now() - t0) / 1000).toFixed(6)} seconds to wake up tags ${list}.`,
        )
      }
      if (modes) this.sleep.resume()
      this.metrics.recordSleepState(0, 0)
      if (this.knobs.profile.sleepComponents)
        this.metrics.recordOperation('wake', (performance.now() - started) / 1000)
      this.kick()
    })
  }

  /**
   * reloadWeights is `collective_rpc reload_weights`: every worker reads its weights again, in place,
   * into the weights' GPU memory. With that memory still released (the `weights` tag not woken) it
   * writes into unmapped memory and the engine dies, as a real one does.
   */
  reloadWeights(): Promise<void> {
    return this.serialized(async () => {
      if (this.sleep.weightsReleased) {
        this.crash(
          'RuntimeError: CUDA error: an illegal memory access was encountered (reload_weights while asleep)',
        )
        throw new Error(ENGINE_DEAD_MESSAGE)
      }
      const t0 = performance.now()
      for (const tag of this.workerTags)
        this.log.info(tag, 'gpu_model_runner.py:3436', 'Reloading weights inplace...')
      await this.delay(this.knobs.reloadDelayMs)
      const secs = ((performance.now() - t0) / 1000).toFixed(2)
      for (const tag of this.workerTags)
        this.log.info(tag, 'default_loader.py:308', `Loading weights took ${secs} seconds`)
      this.sleep.weightsValid = true
    })
  }

  /** watchChildren: from now on, a helper that ends on its own is the engine core dying. */
  watchChildren(): void {
    for (const child of this.children) void child.proc.exited.then(() => this.childExited(child))
  }

  /**
   * childExited: a helper that ends while we are not going down is the engine core dying. During
   * start-up that fails the start; once serving, the API server stays up with /health at 503.
   */
  private childExited(child: EngineChild): void {
    if (this.dying || this.lifetime.signal.aborted || this.engineDead) return
    // A hung engine (SIM_HANG, SIM_HANG_ON_TERM) notices nothing: that is what it simulates.
    if (this.knobs.hang || this.knobs.hangOnTerm) return
    if (!this.server) {
      this.log.error(this.tags.core, 'core.py:708', 'EngineCore failed to start.')
      this.log.stderr(
        `RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': ${child.proc.exitCode ?? -9}}`,
      )
      void this.stop(1)
      return
    }
    this.engineDead = true
    this.dying = true
    if (child.role.startsWith('Worker'))
      this.log.error(
        this.tags.core,
        'multiproc_executor.py:154',
        `Worker proc VllmWorker-${child.role.slice('Worker_TP'.length)} died unexpectedly, shutting down executor.`,
      )
    this.log.error(
      this.tags.api,
      'core_client.py:564',
      'Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.',
    )
    // The rest of the engine core goes with it; the driver frees their memory.
    for (const c of this.children) if (c !== child) c.proc.kill('SIGKILL')
    removeEngineRecord(this.simDir, process.pid)
    for (const r of [...this.live]) r.fail(ENGINE_DEAD_MESSAGE)
    this.scheduler.clear()
  }

  /** engineDeadRequest: a request met the dead engine; the server then exits (terminate_if_errored). */
  engineDeadRequest(): void {
    if (!this.knobs.keepAliveOnEngineDeath) setTimeout(() => void this.stop(0), 20)
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
