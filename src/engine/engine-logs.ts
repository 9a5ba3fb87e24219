/**
 * engine-logs is what the gateway reads from any engine's output, whatever its kind: how far its
 * start-up has got (one phase vocabulary, so progress events mean the same for every engine), its
 * memory split, why it failed, and the line that hints it is about to answer. Each driver parses
 * its own engine's lines into this (vllm-log.ts, and the other kinds' `*-log.ts`).
 */

/**
 * LoadPhase is how far an engine's start-up has got, in order. An engine that has no step of its
 * own for a phase skips it (the phase never goes back).
 */
export type LoadPhase =
  | 'starting'
  | 'loading_weights'
  | 'profiling'
  | 'kv_cache'
  | 'cuda_graphs'
  | 'api_server'
  | 'ready'

export const LOAD_PHASES: readonly LoadPhase[] = [
  'starting',
  'loading_weights',
  'profiling',
  'kv_cache',
  'cuda_graphs',
  'api_server',
  'ready',
]

/** PHASE_PROGRESS is the monotone 0–100 estimate reported while an engine is in a phase. */
export const PHASE_PROGRESS: Readonly<Record<LoadPhase, number>> = {
  starting: 5,
  loading_weights: 30,
  profiling: 55,
  kv_cache: 70,
  cuda_graphs: 85,
  api_server: 95,
  ready: 100,
}

/** MemoryMetrics is an instance's memory_metrics record; every figure is per GPU (one TP rank). */
export interface MemoryMetrics {
  total_gpu_memory_gib: number
  weights_memory_gib: number
  cuda_graph_memory_gib: number
  overhead_memory_gib: number
  kv_cache_available_gib: number
  kv_cache_per_request_mib: number
  max_model_len: number
}

/**
 * StartupTimings are the seconds an engine says its start-up took, when it says so (SGLang's
 * `Engine startup timings (s)`): the whole start-up and the weights' load, for load-time costs.
 */
export interface StartupTimings {
  totalSeconds: number | null
  loadWeightsSeconds: number | null
}

/** MemoryHints are launch facts an engine's logs may lack: its memory fraction and the device size. */
export interface MemoryHints {
  gpuMemoryUtilization?: number
  deviceTotalGib?: number
}

/**
 * EngineLogs follows one engine's output for the gateway. `observe` takes each stdout or stderr
 * line and says whether it is the engine's hint that it is about to answer its health check (the
 * gateway then probes at once instead of waiting for its next poll).
 */
export interface EngineLogs {
  observe(line: string): boolean
  /** phase is the furthest start-up phase the logs have shown; it never goes back. */
  phase(): LoadPhase
  /** progressPercent is PHASE_PROGRESS of the current phase: monotone, 100 only when ready. */
  progressPercent(): number
  /** metrics is the memory split, or null until the figures it needs were printed. */
  metrics(): MemoryMetrics | null
  /** maxModelLen is the context length the engine settled on, when it said so. */
  maxModelLen(): number | null
  /** lastErrorLines returns up to n of the most recent error-ish messages, oldest first. */
  lastErrorLines(n: number): string[]
  /** startupFailure is the message to show for a failed load: the line that names the cause. */
  startupFailure(): string | null
  /** startupTimings: the engine's own account of its start-up, null until it printed one (optional). */
  startupTimings?(): StartupTimings | null
}

/** laterPhase: the later of two phases (start-up never goes back). */
export function laterPhase(current: LoadPhase, next: LoadPhase | undefined): LoadPhase {
  return next && LOAD_PHASES.indexOf(next) > LOAD_PHASES.indexOf(current) ? next : current
}

/**
 * The per-rank figures of a tensor-parallel engine: each rank logs its own; a reader keeps the
 * largest of the figures every rank needs room for and the smallest of what every rank is sized to.
 */
export const maxOf = (m: Map<string, number>): number | null => (m.size ? Math.max(...m.values()) : null)
export const minOf = (m: Map<string, number>): number | null => (m.size ? Math.min(...m.values()) : null)
export const round4 = (n: number): number => Math.round(n * 10_000) / 10_000

/**
 * ErrorLines keeps an engine's most recent error-ish lines (50) and picks the one to show for a
 * failed start: the last that names a cause rather than a wrapper pointing elsewhere (`generic`).
 */
export class ErrorLines {
  private readonly lines: string[] = []

  constructor(private readonly generic: RegExp) {}

  push(message: string): void {
    this.lines.push(message)
    if (this.lines.length > 50) this.lines.shift()
  }

  last(n: number): string[] {
    return n > 0 ? this.lines.slice(-n) : []
  }

  cause(): string | null {
    return this.lines.findLast((e) => !this.generic.test(e)) ?? this.lines.at(-1) ?? null
  }
}
