import type { SimKnobs } from './knobs.ts'
import type { MemoryPlan } from './memory-plan.ts'
import type { EngineMetrics } from './metrics.ts'
import type { ModelSpec } from './models.ts'
import type { Scheduler } from './scheduler.ts'
import type { SleepState } from './sleep-state.ts'
import type { FakeTokenizer } from './tokenizer.ts'
import type { VllmArgs } from './vllm-args.ts'
import type { VllmLog } from './vllm-log.ts'

/** LiveRequest is how the engine reaches an in-flight generation. */
export interface LiveRequest {
  cancel(): void
  fail(message: string): void
}

/**
 * EngineRuntime is what the HTTP handlers and generations of a ready engine share: its configuration,
 * logging, scheduler, sleep state and metrics, plus hooks back into the process lifecycle.
 */
export interface EngineRuntime {
  readonly args: VllmArgs
  readonly knobs: SimKnobs
  readonly log: VllmLog
  /** Process tags for log lines; empty strings in the V0 log style. */
  readonly tags: { api: string; core: string }
  readonly model: ModelSpec
  readonly plan: MemoryPlan
  readonly maxModelLen: number
  readonly createdAt: number
  readonly version: string
  readonly tokenizer: FakeTokenizer
  readonly scheduler: Scheduler
  readonly sleep: SleepState
  readonly metrics: EngineMetrics
  /** True once the process is going down: generations stop emitting. */
  readonly dying: boolean
  /** countToken is called once per emitted token; it may trigger SIM_CRASH_AFTER_TOKENS. */
  countToken(): void
  /** crash ends the process abruptly with a Python-like traceback (exit 1). */
  crash(error: string): void
  /** sleepEngine / wakeEngine change the recorded footprint and log like vLLM. */
  sleepEngine(level: 1 | 2): Promise<void>
  wakeEngine(tags: ('weights' | 'kv_cache')[]): Promise<void>
  /** register tracks live generations so shutdown and crashes can stop them; returns unregister. */
  register(handle: LiveRequest): () => void
}
