import type { EngineClient, EngineClientOptions } from './engine-client.ts'
import type { EngineLogs, MemoryHints } from './engine-logs.ts'

/**
 * EngineDriver is everything the gateway, the router and the benchmarks know about one kind of
 * inference engine: its command line and environment, how its output reads (readiness, memory
 * figures, failures), its control client (health, sleep, wake and its phases, metrics) and what it
 * can do (sleep levels, partial wakes, a shared KV cache). Nothing outside a driver names an engine;
 * src/engine/kinds.ts lists the drivers (the `engine.kind` values). How to add one: README,
 * Architecture, "How to add an engine".
 */

/** LaunchSpec: one load as the gateway decided it, for a driver to turn into argv and environment. */
export interface LaunchSpec {
  modelPath: string
  port: number
  host: string
  servedModelName: string
  /** context length asked for; absent: the model's own */
  maxModelLen?: number
  /** the share of each GPU's memory the engine may take (its own flag's meaning) */
  gpuMemoryUtilization: number
  tensorParallelSize: number
  gpuIds: number[]
  enableSleepMode: boolean
  /** run with the shared KV cache (only when the driver has the capability) */
  sharedCache: boolean
  /** this engine's own shared-cache segment name */
  sharedCacheName?: string
  /** where the engine may send its own traces (OTLP/HTTP), when telemetry asks for it */
  otlpTracesEndpoint?: string | null
  extraArgs: string[]
}

/** EngineCapabilities: what the gateway may ask of an engine of this kind. */
export interface EngineCapabilities {
  /** the sleep levels the engine can sleep at (empty: it cannot sleep) */
  sleepLevels: readonly (1 | 2)[]
  /** a wake may name parts (`tags`: weights, kv_cache) and wake only those */
  partialWake: boolean
  /** the engine runs with kvcached's shared KV cache when the gateway's sharedcache is on */
  sharedCache: boolean
}

/**
 * GPU_MEMORY_UTILIZATION_MIN: the least share of a GPU a load may give its engine (vLLM's
 * --gpu-memory-utilization, SGLang's --mem-fraction-static). The engine must hold its weights, its
 * activations and some KV cache within it: below 5 % (4 GiB of an 80 GiB GPU, 1.2 GiB of a 24 GiB
 * one) no model it serves starts, and a figure such as 1e-300 only fails minutes later, in the
 * engine's own log. Loads, catalogue entries, the cluster's loads and the default in
 * plugins.gateway.engine refuse less; the pre-load check, which loads nothing, answers for any.
 */
export const GPU_MEMORY_UTILIZATION_MIN = 0.05

export interface EngineDriver {
  /** kind: the `engine.kind` value (`vllm`, …) */
  readonly kind: string
  /** label: the engine's name for people (`vLLM`) */
  readonly label: string
  /** defaultCommand: the argv before the driver's arguments when the YAML names none */
  readonly defaultCommand: readonly string[]
  /**
   * managedFlags: flags the gateway sets from the load body (with their aliases); extra_args must
   * not set them. `--port` is not among them: extra_args may choose the port.
   */
  readonly managedFlags: readonly string[]
  /**
   * refusedFlags: flags no engine modelgate manages may run with, each with the reason given when
   * extra_args set one (vLLM's `--sleep-idle-ttl`: it would sleep behind modelgate's back).
   */
  readonly refusedFlags: Readonly<Record<string, string>>
  readonly capabilities: EngineCapabilities
  /**
   * sleepShare: the share of what sleep mode can release (weights and KV cache, or the weights
   * alone with a shared KV cache) that a sleep at each level should free (the memory check).
   */
  readonly sleepShare: Readonly<Partial<Record<1 | 2, number>>>
  /**
   * freesAfterSleep: the engine may answer a sleep before its memory is given back (SGLang), so the
   * sleep check reads the GPU again until the memory is free (plugins.gateway.sleep.verify_wait_ms).
   */
  readonly freesAfterSleep?: boolean
  /** wakePhases: the phases a whole wake from `level` runs, in order (the wake's progress). */
  wakePhases(level: 1 | 2): readonly string[]
  /** allWakePhases: every phase name a wake may report, and what they mean (the API's schema). */
  readonly allWakePhases: readonly string[]
  readonly wakePhasesDoc: string
  /** args: the arguments after the command (the model and the flags). */
  args(spec: LaunchSpec): string[]
  /** env: what the engine's environment gets besides modelgate's own and engine.env. */
  env(spec: LaunchSpec): Record<string, string>
  /** logs: a fresh reader of one engine's output. */
  logs(hints: MemoryHints): EngineLogs
  /** client: the control client of an engine at `baseUrl`. */
  client(baseUrl: string, timeoutMs?: number, opts?: EngineClientOptions): EngineClient
  /**
   * looksLike: what in a process's kernel name (`comm`, 15 characters) or command line says it is
   * this engine, for the orphans listing: its launch `command` (the program or the module an
   * interpreter runs, never a mere argument, so `grep vllm serve` is none) and its workers'
   * `process_name` (the titles the engine gives its child processes).
   */
  looksLike(p: { comm: string; argv: readonly string[] }): ('command' | 'process_name')[]
}

/** programBase: the file name of argv[i] (the program, or the script an interpreter runs). */
export function programBase(argv: readonly string[], i: number): string {
  const a = argv[i] ?? ''
  return a.slice(a.lastIndexOf('/') + 1)
}
