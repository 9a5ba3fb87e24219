import type { SimKnobs } from './knobs.ts'
import type { MemoryPlan } from './memory-plan.ts'
import type { EngineMetrics, InferenceMetrics } from './metrics.ts'
import type { ModelSpec } from './models.ts'
import type { Scheduler, Sequence } from './scheduler.ts'
import type { PauseMode, SleepState } from './sleep-state.ts'
import type { FakeTokenizer } from './tokenizer.ts'
import type { VllmArgs } from './vllm-args.ts'
import type { SimLog, VllmLog } from './vllm-log.ts'

/** LiveRequest is how the engine reaches an in-flight generation. */
export interface LiveRequest {
  /** cancel stops it silently (shutdown). */
  cancel(): void
  /** fail ends it with an engine error (crash, dead engine core). */
  fail(message: string): void
  /** abort finishes it with finish_reason `abort` (a sleep with mode=abort). */
  abort(): void
}

/**
 * InferenceRuntime is what the OpenAI handlers (openai-request.ts, openai-response.ts, pooling.ts)
 * and generations (generation.ts) need of a ready engine of any kind: its served names, knobs,
 * logging, tokenizer, scheduler, sleep state and metrics, plus hooks back into its lifecycle. Each
 * simulated engine kind implements it.
 */
export interface InferenceRuntime {
  readonly args: { readonly model: string; readonly servedModelNames: readonly string[] }
  readonly knobs: SimKnobs
  readonly log: SimLog
  /** Process tags for log lines; empty strings where the format has none. */
  readonly tags: { api: string; core: string }
  readonly maxModelLen: number
  readonly tokenizer: FakeTokenizer
  readonly scheduler: Scheduler
  readonly sleep: SleepState
  readonly metrics: InferenceMetrics
  /** True once the process is going down: generations stop emitting. */
  readonly dying: boolean
  /** countToken is called once per emitted token; it may trigger SIM_CRASH_AFTER_TOKENS. */
  countToken(): void
  /** crash ends the process abruptly with a Python-like traceback. */
  crash(error: string): void
  /** canRun says whether a sequence may be admitted or emit now (sleep, scheduler pause). */
  canRun(seq: Sequence): boolean
  /** whenRunnable calls cb once canRun may have become true (after a wake or a resume). */
  whenRunnable(cb: () => void): void
  /** register tracks live generations so shutdown and crashes can stop them; returns unregister. */
  register(handle: LiveRequest): () => void
}

/**
 * EngineRuntime is the simulated vLLM engine's: the inference runtime plus its configuration,
 * memory plan, version and the sleep, wake and weight-reload hooks of its development routes.
 */
export interface EngineRuntime extends InferenceRuntime {
  readonly args: VllmArgs
  readonly log: VllmLog
  readonly model: ModelSpec
  readonly plan: MemoryPlan
  readonly createdAt: number
  readonly version: string
  readonly metrics: EngineMetrics
  /** True once the engine core process died while the API server lives on (/health answers 503). */
  readonly engineDead: boolean
  /** Number of GPU worker processes (TP ranks): collective_rpc answers one result per worker. */
  readonly workerCount: number
  /** The simulator's state dir (--sim-dir): where it records what tests may check (traces.ts). */
  readonly simDir: string
  /** sleepEngine / wakeEngine change the recorded footprint and log like vLLM. */
  sleepEngine(level: 0 | 1 | 2, mode: PauseMode): Promise<void>
  /**
   * wakeEngine wakes the given tags (all when undefined); `scheduling` only resumes the scheduler; a
   * tag that is not asleep makes it wake nothing.
   */
  wakeEngine(tags: string[] | undefined): Promise<void>
  /** releaseKvCache is `/release_kv_cache_memory` (current builds): the KV cache alone is freed. */
  releaseKvCache(): Promise<void>
  /** reloadWeights is `collective_rpc reload_weights`: reads the weights again into GPU memory. */
  reloadWeights(): Promise<void>
  /** engineDeadRequest handles a request that met the dead engine (the server then shuts down). */
  engineDeadRequest(): void
}
