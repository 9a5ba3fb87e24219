import type { Server } from 'bun'
import { pause } from '../host/abortable.ts'
import { type EngineChild, killEngineChildren } from './children.ts'
import type { SimGpu } from './gpus.ts'
import { readKnobs, type SimKnobs } from './knobs.ts'
import { lookupModel, type ModelSpec } from './models.ts'
import type { InferenceRuntime, LiveRequest } from './runtime.ts'
import { Scheduler, type Sequence } from './scheduler.ts'
import type { SglangArgs } from './sglang-args.ts'
import { SglangLog } from './sglang-log.ts'
import { planSglangMemory, type SglangPlan } from './sglang-memory.ts'
import { SglangMetrics } from './sglang-metrics.ts'
import { SleepState } from './sleep-state.ts'
import { removeEngineRecord, writeEngineRecord } from './state.ts'
import { FakeTokenizer } from './tokenizer.ts'
import { resolveSglangProfile, type SglangProfile } from './versions.ts'
import { processSink } from './vllm-log.ts'

/**
 * SglangEngine is one simulated `python -m sglang.launch_server`: it starts as SGLang does
 * (sglang-boot.ts: its log lines, its port open before it is ready, its warmup), serves SGLang's
 * HTTP API (sglang-api.ts), keeps its footprint in the shared state directory under its scheduler
 * processes (`sglang::scheduler[_TPn]`, as nvidia-smi shows them), and releases and resumes its
 * memory as SGLang does, quirks and failures included (read in sgl-project/sglang):
 *
 * - release with a request in any queue (running, waiting, paused by `/pause_generation`: what
 *   `/get_load` reports), or a resume of a tag that is not released, is an
 *   exception in the scheduler (an assertion, a KeyError): `Scheduler hit an exception`, the server
 *   gets SIGQUIT and kills its process tree (`Received sigquit from a child process`);
 * - a release answers before its memory is given back: nvidia-smi shows it SIM_SGLANG_RELEASE_LAG_MS
 *   longer (default 0);
 * - without `--enable-memory-saver` release and resume answer 200 and free nothing;
 * - without `--enable-weights-cpu-backup` a release discards the weights: after a resume the engine
 *   generates garbage until `POST /update_weights_from_disk`;
 * - a generation on released memory (a request, or /health's own one-token generation) touches
 *   unmapped pages: CUDA's illegal memory access, the scheduler dies with the server;
 * - a scheduler process that dies by a signal leaves the server up: /health's generation then gets
 *   no answer for SGLANG_HEALTH_CHECK_TIMEOUT (20 s) and answers 503, and requests hang.
 */
/** SglangStopped: the process is going down; a start-up step waiting on delay() ends with it. */
export class SglangStopped extends Error {}

export const MEMORY_TAGS = ['kv_cache', 'weights', 'weights_drafter', 'cuda_graph'] as const

export class SglangEngine implements InferenceRuntime {
  readonly knobs: SimKnobs
  /** the SGLang release imitated (SIM_SGLANG_VERSION, versions.ts): which start-up lines it prints */
  readonly profile: SglangProfile
  readonly log = new SglangLog()
  readonly tags = { api: '', core: ' TP0' }
  readonly model: ModelSpec
  readonly args: { model: string; servedModelNames: string[] }
  readonly tokenizer = new FakeTokenizer()
  readonly sleep = new SleepState()
  readonly metrics: SglangMetrics
  readonly createdAt = Math.floor(Date.now() / 1000)
  readonly lifetime = new AbortController()
  /** the per-request time `/health` waits before it looks for an answer (SGLang: 1 s) */
  readonly healthTickMs: number
  /** SGLANG_HEALTH_CHECK_TIMEOUT: how long /health waits for its generation (s) */
  readonly healthTimeoutMs: number
  /** SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION: /health runs a generation (default on) */
  readonly healthGeneration: boolean
  plan: SglangPlan
  maxModelLen: number
  scheduler: Scheduler
  /** loaded: how far the memory goes (footprint per GPU follows it) */
  loaded: 'none' | 'context' | 'weights' | 'kv' | 'all' = 'none'
  /** ready: the warmup passed (SGLang's ServerStatus.Up); /health answers 503 before */
  ready = false
  dying = false
  /** schedulerDead: a scheduler process died without the exception path (the server lives on) */
  schedulerDead = false
  usedGpus: number[] = []
  children: EngineChild[] = []
  server: Server<unknown> | undefined
  /** offloadTags: the scheduler's set of released tags (even without the memory saver) */
  readonly offloadTags = new Set<string>()
  /**
   * SIM_SGLANG_RELEASE_LAG_MS: how long after a release answered its memory is still held (the
   * driver returns the pages to CUDA after the call came back); nvidia-smi shows it until then.
   */
  readonly releaseLagMs: number
  /** freedAt: when the memory of the last release is really given back (performance.now()) */
  private freedAt = 0
  /** paused: `/pause_generation` stopped the scheduler (requests stay, counted as paused) */
  generationPaused = false
  private readonly live = new Set<LiveRequest>()
  private runWaiters: (() => void)[] = []
  private readonly timers: ReturnType<typeof setInterval>[] = []
  private readonly exit = Promise.withResolvers<number>()
  private readonly startedAt = new Date().toISOString()
  private tokensEmitted = 0
  private lastRecord = ''
  private readonly onTerm = () => {
    if (!this.knobs.hangOnTerm) void this.stop(0)
  }

  constructor(
    readonly sglang: SglangArgs,
    readonly env: NodeJS.ProcessEnv,
    readonly simDir: string,
    readonly gpus: SimGpu[],
  ) {
    // SGLang's OpenAI errors are the older `{"object": "error", …}` shape; inference on released
    // memory kills the engine (there is no queueing behind a sleep as newer vLLM has).
    this.knobs = { ...readKnobs(env), errorShape: 'old', sleepInference: 'crash' }
    this.profile = resolveSglangProfile(env['SIM_SGLANG_VERSION'])
    this.model = lookupModel(sglang.modelPath)
    this.args = { model: sglang.modelPath, servedModelNames: [sglang.servedModelName] }
    this.maxModelLen = sglang.contextLength ?? this.model.maxModelLen
    this.metrics = new SglangMetrics(sglang.servedModelName)
    this.plan = planSglangMemory(this.model, 81559, 81559, 0.88, 1, this.maxModelLen, true)
    this.scheduler = new Scheduler(1, 0, () => false)
    const num = (v: string | undefined, d: number) => (v && Number.isFinite(Number(v)) ? Number(v) : d)
    this.healthTickMs = num(env['SIM_SGLANG_HEALTH_TICK_MS'], 1000)
    this.releaseLagMs = num(env['SIM_SGLANG_RELEASE_LAG_MS'], 0)
    this.healthTimeoutMs = num(env['SGLANG_HEALTH_CHECK_TIMEOUT'], 20) * 1000
    this.healthGeneration = !/^(0|false|no|off)$/i.test(env['SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION'] ?? '')
  }

  /** run starts the process's life with `boot` (sglang-boot.ts) and resolves with its exit code. */
  async run(boot: (e: SglangEngine) => Promise<void>): Promise<number> {
    process.on('SIGTERM', this.onTerm)
    process.on('SIGINT', this.onTerm)
    boot(this).catch((err: unknown) => {
      if (err instanceof SglangStopped) return
      this.log.stderr(String((err as Error)?.stack ?? err))
      void this.stop(1)
    })
    return this.exit.promise
  }

  /** delay is an abortable wait: shutdown during start-up rejects it with SglangStopped. */
  async delay(ms: number): Promise<void> {
    await pause(ms, this.lifetime.signal)
    if (this.lifetime.signal.aborted) throw new SglangStopped()
  }

  /** released: what the memory saver took away (nothing without --enable-memory-saver). */
  isReleased(tag: string): boolean {
    return this.sglang.enableMemorySaver && this.offloadTags.has(tag)
  }

  /** heldAfterRelease: a released tag whose memory the GPU still shows (the release lag). */
  private held(tag: string): boolean {
    return !this.isReleased(tag) || performance.now() < this.freedAt
  }

  footprintMib(): number {
    const p = this.plan
    const gib = (x: number) => Math.round(x * 1024)
    if (this.loaded === 'none') return 0
    let mib = gib(p.contextGiB)
    if (this.loaded === 'context') return mib
    if (this.held('weights')) mib += gib(p.weightsGiB)
    if (this.loaded === 'weights') return mib
    if (this.held('kv_cache')) mib += gib(p.kvGiB)
    if (this.loaded === 'kv') return mib
    if (this.held('cuda_graph')) mib += gib(p.graphsGiB)
    return mib
  }

  /** writeRecord publishes the footprint (only when it changed) for the smi simulator. */
  writeRecord(): void {
    if (this.loaded === 'none' || this.dying) return
    const schedulers = this.children.filter((c) => c.role.startsWith('scheduler'))
    const apps = this.usedGpus.map((gpu, i) => ({
      pid: schedulers[i]?.pid ?? process.pid,
      gpu,
      process_name: schedulers[i]?.processName ?? 'python3',
    }))
    const running = this.scheduler.running.size
    const record = {
      pid: process.pid,
      gpus: this.usedGpus,
      used_mib_per_gpu: this.footprintMib(),
      process_name: 'python3',
      apps,
      model: this.sglang.modelPath,
      started_at: this.startedAt,
      running,
      busy: running > 0,
      sleeping: this.offloadTags.size > 0,
      port: this.sglang.port,
    }
    const json = JSON.stringify(record)
    if (json !== this.lastRecord) {
      this.lastRecord = json
      writeEngineRecord(this.simDir, record)
    }
  }

  startTimers(): void {
    this.timers.push(setInterval(() => this.writeRecord(), 250))
  }

  register(handle: LiveRequest): () => void {
    this.live.add(handle)
    return () => this.live.delete(handle)
  }

  /** busy: requests in the scheduler (running, queued or paused), what release asserts there are none of. */
  get busy(): number {
    return this.scheduler.running.size + this.scheduler.numWaiting
  }

  /**
   * load is `/get_load`'s one entry per data-parallel rank (one here): every queue the scheduler's
   * idle check looks at. The simulator has no grammar backend and never retracts, so those are 0;
   * the requests of a paused scheduler count as paused.
   */
  load(): Record<string, number> {
    const running = this.scheduler.running.size
    const waiting = this.scheduler.numWaiting
    const paused = this.generationPaused ? running + waiting : 0
    return {
      dp_rank: 0,
      num_reqs: running + waiting,
      num_running_reqs: this.generationPaused ? 0 : running,
      num_waiting_reqs: this.generationPaused ? 0 : waiting,
      num_grammar_queue_reqs: 0,
      num_paused_reqs: paused,
      num_retracted_reqs: 0,
      num_tokens: this.scheduler.usedTokens,
    }
  }

  canRun(_seq: Sequence): boolean {
    return !this.dying && !this.schedulerDead && !this.sleep.blocksInference && !this.generationPaused
  }

  /** pauseGeneration / continueGeneration: the scheduler stops and goes on (its requests stay). */
  pauseGeneration(): void {
    this.generationPaused = true
  }

  continueGeneration(): void {
    this.generationPaused = false
    this.kick()
  }

  whenRunnable(cb: () => void): void {
    this.runWaiters.push(cb)
  }

  kick(): void {
    const waiters = this.runWaiters
    this.runWaiters = []
    for (const w of waiters) w()
    this.scheduler.pump()
  }

  countToken(): void {
    this.tokensEmitted++
    const limit = this.knobs.crashAfterTokens
    if (limit !== undefined && this.tokensEmitted >= limit)
      this.crash('RuntimeError: CUDA error: an illegal memory access was encountered')
  }

  /**
   * crash is an exception in a scheduler process: its traceback under `Scheduler hit an exception`,
   * then the server's SIGQUIT handler kills the whole process tree (kill_process_tree: the server
   * itself is SIGKILLed).
   */
  crash(error: string, where = 'scheduler.py", line 2706, in event_loop_overlap'): void {
    if (this.dying) return
    this.dying = true
    const site = '/usr/local/lib/python3.12/dist-packages/sglang/srt/managers'
    processSink.syncStderr(
      [
        this.log
          .format(this.tags.core, 'Scheduler hit an exception: Traceback (most recent call last):')
          .trimEnd(),
        `  File "${site}/${where}`,
        '    self.process_input_requests(recv_reqs)',
        error,
        '',
        this.log.format('', 'Received sigquit from a child process. It usually means the child failed.'),
      ].join('\n'),
    )
    for (const r of [...this.live]) r.cancel()
    for (const c of this.children) c.proc.kill('SIGKILL')
    removeEngineRecord(this.simDir, process.pid)
    setTimeout(() => process.kill(process.pid, 'SIGKILL'), 20)
  }

  /** watchChildren: a scheduler that ends on its own (a signal: no traceback) leaves the server up. */
  watchChildren(): void {
    for (const child of this.children)
      void child.proc.exited.then(() => {
        if (this.dying || this.lifetime.signal.aborted || this.knobs.hang) return
        this.log.warning(
          '',
          'engine.py',
          `Child process unexpectedly failed with an exit code ${child.proc.exitCode ?? 9}. pid=${child.pid}`,
        )
        this.schedulerDead = true
        removeEngineRecord(this.simDir, process.pid)
      })
  }

  /** releaseMemory is the scheduler's release_memory_occupation (see the class comment). */
  releaseMemory(tags: string[] | undefined): void {
    if (this.busy > 0) {
      this.crash(
        'AssertionError: release_memory_occupation should be called only when no ongoing request.',
        'scheduler_update_weights_mixin.py", line 117, in release_memory_occupation',
      )
      return
    }
    for (const tag of tags?.length ? tags : MEMORY_TAGS) this.offloadTags.add(tag)
    if (this.sglang.enableMemorySaver && (this.isReleased('weights') || this.isReleased('kv_cache')))
      this.sleep.sleep(this.sglang.enableWeightsCpuBackup ? 1 : 2, 'all')
    this.freedAt = performance.now() + this.releaseLagMs
    if (this.releaseLagMs > 0) setTimeout(() => this.writeRecord(), this.releaseLagMs + 1)
    this.writeRecord()
  }

  /** resumeMemory is the scheduler's resume_memory_occupation: every tag must have been released. */
  resumeMemory(tags: string[] | undefined): void {
    for (const tag of tags?.length ? tags : MEMORY_TAGS) {
      if (!this.offloadTags.has(tag)) {
        this.crash(
          `KeyError: '${tag}'`,
          'scheduler_update_weights_mixin.py", line 149, in resume_memory_occupation',
        )
        return
      }
      this.offloadTags.delete(tag)
    }
    if (!this.isReleased('weights') && !this.isReleased('kv_cache') && this.sleep.executorAsleep)
      this.sleep.wake(['weights', 'kv_cache'])
    this.writeRecord()
    this.kick()
  }

  /** stop: SIGTERM ends the server as uvicorn does, then its process tree; idempotent. */
  async stop(code: number): Promise<void> {
    if (this.lifetime.signal.aborted) return
    this.lifetime.abort()
    const server = this.server
    if (server) this.log.uvicorn('Shutting down')
    this.dying = true
    for (const r of [...this.live]) r.cancel()
    this.scheduler.clear()
    for (const t of this.timers) clearInterval(t)
    void server?.stop(true)
    removeEngineRecord(this.simDir, process.pid)
    await killEngineChildren(this.children)
    if (server) {
      this.log.uvicorn('Waiting for application shutdown.')
      this.log.uvicorn('Application shutdown complete.')
      this.log.uvicorn(`Finished server process [${process.pid}]`)
    }
    process.off('SIGTERM', this.onTerm)
    process.off('SIGINT', this.onTerm)
    this.exit.resolve(code)
    setTimeout(() => process.exit(code), 300).unref()
  }
}
