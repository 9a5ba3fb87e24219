/**
 * vllm-log turns the start-up and sleep output of `vllm serve` into typed facts. The gateway cannot
 * ask a running engine how its memory splits into weights, CUDA graphs and KV cache, nor how far its
 * start-up has got; vLLM only says so in its logs. Every message variant listed in ENGINE-NOTES
 * (V0 and V1 engines, v0.8.5 → 2026 builds) is recognised, and kvcached's own memory line, which
 * replaces vLLM's for shared-cache engines; anything else yields null. The table of
 * real lines per release is test/fixtures/vllm/ (one file per vLLM version, checked by
 * test/engine/vllm-log.test.ts). The vocabulary it reports in (phases, memory figures) is every
 * engine's (engine-logs.ts).
 */
import { stripAnsi } from './ansi.ts'
import {
  type EngineLogs,
  ErrorLines,
  type LoadPhase,
  laterPhase,
  type MemoryHints,
  type MemoryMetrics,
  maxOf,
  minOf,
  PHASE_PROGRESS,
  round4,
} from './engine-logs.ts'

export { stripAnsi }

/** VllmLogLine is one output line split into its process tag, log level and message. */
export interface VllmLogLine {
  /** worker is the process tag as printed, e.g. `EngineCore_DP0 pid=441`, `Worker_TP1 pid=9`. */
  worker: string | null
  /** level is `INFO`, `ERROR`, … from vLLM's or uvicorn's prefix; null for continuation lines. */
  level: string | null
  message: string
}

type FactBody =
  | { kind: 'weights'; gib: number; seconds: number | null }
  | { kind: 'kv_available'; gib: number }
  /**
   * kvcached's replacement of vLLM's memory probe (kvcached f8bbb00, #448, and later): `Using kvcached
   * process-local KV capacity: budget=B bytes, weights=W bytes, torch_peak=P bytes, cudagraph=G bytes
   * (ignored), available=A bytes; …`. vLLM's `Available KV cache memory` line is then not printed;
   * `available` is the KV capacity the engine sizes its cache to, `budget` is utilization × device.
   */
  | { kind: 'kvcached_capacity'; budgetGib: number; weightsGib: number | null; availableGib: number }
  | { kind: 'kv_tokens'; tokens: number }
  | { kind: 'concurrency'; tokensPerRequest: number; concurrency: number }
  /** Newer builds' single line: `GPU KV cache size: N tokens, Maximum concurrency for M tokens per request: Xx`. */
  | { kind: 'kv_capacity'; tokens: number; tokensPerRequest: number; concurrency: number }
  | { kind: 'cuda_graphs'; gib: number; seconds: number }
  | { kind: 'max_model_len'; tokens: number }
  | { kind: 'v0_budget'; deviceTotalGib: number; utilization: number; budgetGib: number }
  | {
      kind: 'v0_breakdown'
      weightsGib: number
      nonTorchGib: number | null
      activationPeakGib: number | null
      kvCacheGib: number
    }
  | { kind: 'sleep_freed'; freedGib: number; stillInUseGib: number }
  | { kind: 'sleep_took'; seconds: number }
  | { kind: 'wake_took'; seconds: number }
  | {
      kind: 'free_memory_error'
      /** The device named by newer builds (`cuda:1`); absent in older ones. */
      device?: string
      freeGib: number
      deviceTotalGib: number
      utilization: number
      desiredGib: number
      message: string
    }
  /**
   * Newer builds' informational start-up summary (not an error): `Free memory on device (X/Y GiB) on
   * startup. Desired GPU memory utilization is (U, Z GiB). Actual usage is …`; the CUDA-graph and
   * KV-cache figures when the line carries them (bytes in 0.10/0.11, GiB later).
   */
  | {
      kind: 'startup_memory'
      freeGib: number
      deviceTotalGib: number
      utilization: number
      desiredGib: number
      cudaGraphGib: number | null
      kvCacheGib: number | null
    }
  | { kind: 'server_started'; pid: number }
  | { kind: 'app_startup_waiting' }
  | { kind: 'app_startup_complete' }
  | { kind: 'phase'; phase: LoadPhase }
  | { kind: 'error'; message: string }

/** VllmLogFact is what one line says; `worker` tells TP ranks apart so callers can sum or max. */
export type VllmLogFact = FactBody & { worker: string | null }

const N = String.raw`(-?\d[\d,]*(?:\.\d+)?)`
const GIB = String.raw`\s?GiB`
const TAG = /^\(([A-Za-z][\w.-]*(?:\s+rank=\d+)?(?:\s+pid=\d+)?)\)\s*/
const VLLM_PREFIX =
  /^(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s+(?:\[[^\]]*\]|[\w.-]+:\d+\])\s?/
const UVICORN_PREFIX = /^(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+/
/** kvcached's own logger (kvcached/utils.py): `[kvcached][LEVEL][YYYY-MM-DD HH:MM:SS][file.py:LINE] `. */
const KVCACHED_PREFIX = /^\[kvcached\]\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\]\[[^\]]*\]\[[^\]]*\]\s?/
const EXCEPTION_LINE = /^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::.*)?$/

const num = (s: string | undefined): number => Number((s ?? '').replace(/,/g, ''))
const re = (source: string): RegExp => new RegExp(source)

type Rule = [RegExp, (m: RegExpMatchArray, message: string) => FactBody]

/** RULES are tried in order; the first match wins, so specific messages precede generic ones. */
const RULES: Rule[] = [
  [
    re(
      `Free memory on device(?: ([\\w:.-]+))? \\(${N}/${N}${GIB}\\) on startup is less than desired GPU memory utilization \\(${N}, ${N}${GIB}\\)`,
    ),
    (m, message) => ({
      kind: 'free_memory_error',
      device: m[1],
      freeGib: num(m[2]),
      deviceTotalGib: num(m[3]),
      utilization: num(m[4]),
      desiredGib: num(m[5]),
      message: message.slice(message.indexOf('Free memory on device')).trim(),
    }),
  ],
  [
    re(
      `Free memory on device(?: [\\w:.-]+)? \\(${N}/${N}${GIB}\\) on startup\\. Desired GPU memory utilization is \\(${N}, ${N}${GIB}\\)`,
    ),
    (m, message) => {
      const graphs = message.match(re(`${N}${GIB} for (?:CUDA ?|NPU |XPU )?[Gg]raph memory`))
      const kv = message.match(
        re(`(?:Current kv cache memory in use is|Current KV cache memory:) ${N}(\\s?GiB| bytes)`),
      )
      const kvGib = kv ? num(kv[1]) / (kv[2]?.includes('bytes') ? 2 ** 30 : 1) : null
      return {
        kind: 'startup_memory',
        freeGib: num(m[1]),
        deviceTotalGib: num(m[2]),
        utilization: num(m[3]),
        desiredGib: num(m[4]),
        cudaGraphGib: graphs ? num(graphs[1]) : null,
        kvCacheGib: kvGib === null ? null : round4(kvGib),
      }
    },
  ],
  [
    re(`Model loading took ${N}\\s?Gi?B(?: memory)? and ${N}\\s?s`),
    (m) => ({ kind: 'weights', gib: num(m[1]), seconds: num(m[2]) }),
  ],
  [re(`Loading model weights took ${N}\\s?GB`), (m) => ({ kind: 'weights', gib: num(m[1]), seconds: null })],
  [re(`Available KV cache memory: ${N}${GIB}`), (m) => ({ kind: 'kv_available', gib: num(m[1]) })],
  [
    re(
      `Using kvcached process-local KV capacity: budget=${N} bytes(?:, weights=${N} bytes)?.*?, available=${N} bytes`,
    ),
    (m) => ({
      kind: 'kvcached_capacity',
      budgetGib: round4(num(m[1]) / 2 ** 30),
      weightsGib: m[2] === undefined ? null : round4(num(m[2]) / 2 ** 30),
      availableGib: round4(num(m[3]) / 2 ** 30),
    }),
  ],
  [
    re(`[A-Z]+ KV cache size: ${N} tokens, Maximum concurrency for ${N} tokens per request: ${N}x`),
    (m) => ({ kind: 'kv_capacity', tokens: num(m[1]), tokensPerRequest: num(m[2]), concurrency: num(m[3]) }),
  ],
  [re(`[A-Z]+ KV cache size: ${N} tokens`), (m) => ({ kind: 'kv_tokens', tokens: num(m[1]) })],
  [
    re(`Maximum concurrency for ${N} tokens per request: ${N}x`),
    (m) => ({ kind: 'concurrency', tokensPerRequest: num(m[1]), concurrency: num(m[2]) }),
  ],
  [
    re(`Graph capturing finished in ${N} secs?, took ${N}${GIB}`),
    (m) => ({ kind: 'cuda_graphs', seconds: num(m[1]), gib: num(m[2]) }),
  ],
  [re(`Using max model len ${N}`), (m) => ({ kind: 'max_model_len', tokens: num(m[1]) })],
  [re(`\\bmax_seq_len=${N}`), (m) => ({ kind: 'max_model_len', tokens: num(m[1]) })],
  [
    re(`total_gpu_memory \\(${N}${GIB}\\) x gpu_memory_utilization \\(${N}\\) = ${N}${GIB}`),
    (m) => ({ kind: 'v0_budget', deviceTotalGib: num(m[1]), utilization: num(m[2]), budgetGib: num(m[3]) }),
  ],
  [
    re(
      `model weights take ${N}${GIB};(?:.*?non_torch_memory takes ${N}${GIB};)?(?:.*?activation peak memory takes ${N}${GIB};)?.*?KV Cache is ${N}${GIB}`,
    ),
    (m) => ({
      kind: 'v0_breakdown',
      weightsGib: num(m[1]),
      nonTorchGib: m[2] === undefined ? null : num(m[2]),
      activationPeakGib: m[3] === undefined ? null : num(m[3]),
      kvCacheGib: num(m[4]),
    }),
  ],
  [
    re(`Sleep mode freed ${N}${GIB} memory, ${N}${GIB} memory is still in use`),
    (m) => ({ kind: 'sleep_freed', freedGib: num(m[1]), stillInUseGib: num(m[2]) }),
  ],
  [re(`It took ${N} seconds to fall asleep`), (m) => ({ kind: 'sleep_took', seconds: num(m[1]) })],
  [re(`It took ${N} seconds to wake up`), (m) => ({ kind: 'wake_took', seconds: num(m[1]) })],
  [/^Started server process \[(\d+)\]/, (m) => ({ kind: 'server_started', pid: num(m[1]) })],
  [/^Waiting for application startup/, () => ({ kind: 'app_startup_waiting' })],
  [/^Application startup complete/, () => ({ kind: 'app_startup_complete' })],
]

/** PHASE_HINTS are progress lines that carry no figure but show which phase has begun. */
const PHASE_HINTS: [RegExp, LoadPhase][] = [
  [
    /Starting to load model|Loading model weights|Loading weights took|Loading (?:safetensors|pt) checkpoint shards/,
    'loading_weights',
  ],
  [
    /Memory profiling takes|torch\.compile takes|Dynamo bytecode transform|Compiling a graph for/,
    'profiling',
  ],
  [/Capturing (?:CUDA graphs?|cudagraphs?|the model for CUDA graphs)/i, 'cuda_graphs'],
  [/Starting vLLM API server|Available routes are|init engine \(profile, create kv cache/, 'api_server'],
]

/** splitVllmLine strips ANSI codes, a carriage-return progress bar, the process tag and the prefix. */
export function splitVllmLine(line: string): VllmLogLine {
  const segments = stripAnsi(line).split('\r')
  let text = (segments.findLast((s) => s.trim() !== '') ?? '').trimEnd()
  let worker: string | null = null
  const tag = TAG.exec(text)
  if (tag) {
    worker = tag[1] ?? null
    text = text.slice(tag[0].length)
  }
  let level: string | null = null
  const prefix = VLLM_PREFIX.exec(text) ?? UVICORN_PREFIX.exec(text) ?? KVCACHED_PREFIX.exec(text)
  if (prefix) {
    level = prefix[1] === 'WARN' ? 'WARNING' : (prefix[1] ?? null)
    text = text.slice(prefix[0].length)
  }
  return { worker, level, message: text.trim() }
}

/** isErrorLine says whether a message is error-ish: an ERROR/CRITICAL record or a Python exception. */
function isErrorLine(level: string | null, message: string): boolean {
  if (message === '') return false
  if (level === 'ERROR' || level === 'CRITICAL') return true
  return EXCEPTION_LINE.test(message) || message.includes('CUDA out of memory')
}

/** parseVllmLine reads one stdout/stderr line of `vllm serve`; null when it carries nothing known. */
export function parseVllmLine(line: string): VllmLogFact | null {
  const { worker, level, message } = splitVllmLine(line)
  if (message === '') return null
  for (const [pattern, build] of RULES) {
    const m = message.match(pattern)
    if (m) return { ...build(m, message), worker }
  }
  if (isErrorLine(level, message)) return { kind: 'error', message, worker }
  for (const [pattern, phase] of PHASE_HINTS) {
    if (pattern.test(message)) return { kind: 'phase', phase, worker }
  }
  return null
}

/** WorkerMemory is what one engine process (TP rank) reported, for callers that want sums. */
export interface WorkerMemory {
  worker: string
  weightsGib: number | null
  kvCacheAvailableGib: number | null
  cudaGraphGib: number | null
}

/** FreeMemoryFailure is vLLM's start-up refusal with its figures (GiB). */
export interface FreeMemoryFailure {
  device: string | null
  freeGib: number
  deviceTotalGib: number
  utilization: number
  desiredGib: number
  message: string
}

/** StartupMemory is what a newer build's start-up summary said (per GPU, the tightest rank). */
export interface StartupMemory {
  freeGib: number
  deviceTotalGib: number
  utilization: number
  desiredGib: number
}

export interface SleepFigures {
  freedGib: number
  stillInUseGib: number
  seconds: number | null
}

/** GENERIC_FAILURES are wrapper messages that point elsewhere; a root-cause line is preferred. */
const GENERIC_FAILURES =
  /^Traceback|Engine core initialization failed|EngineCore failed to start|See (?:the )?(?:root cause|stack trace)|Engine process failed to start/

/** FACT_PHASE is the phase a figure shows has begun (weights loaded → profiling runs next). */
const FACT_PHASE: Partial<Record<VllmLogFact['kind'], LoadPhase>> = {
  weights: 'profiling',
  v0_budget: 'profiling',
  kv_available: 'kv_cache',
  kvcached_capacity: 'kv_cache',
  kv_tokens: 'kv_cache',
  concurrency: 'kv_cache',
  kv_capacity: 'kv_cache',
  startup_memory: 'cuda_graphs',
  v0_breakdown: 'kv_cache',
  cuda_graphs: 'cuda_graphs',
  server_started: 'api_server',
  app_startup_waiting: 'api_server',
  app_startup_complete: 'ready',
}

/**
 * VllmLogAccumulator follows one engine's output and answers: what phase is start-up in, what does
 * the engine's memory split into, and why did it fail. Figures are per GPU: with tensor parallelism
 * each rank logs its own lines, and the accumulator keeps the largest weights and CUDA-graph figures
 * and the smallest KV-cache figure (vLLM sizes every rank's cache to the smallest rank's room).
 * Multiply by tensor_parallel_size for an engine-wide figure, or read `workers()` to sum.
 *
 * Total footprint = gpu_memory_utilization × device total when both hints are given, else the V0
 * budget line, else kvcached's budget (a shared-cache engine, whose KV figure is kvcached's
 * `available`), else the desired memory of newer builds' start-up summary, else weights + CUDA graphs
 * + KV cache (overhead 0). Without `Using max model len` the context length comes from the engine
 * config's `max_seq_len=` or the concurrency line's tokens per request; KV per request from the
 * concurrency (separate or merged line) or from the tokens and the context length. When the parts exceed the budget
 * (V1 engines capture CUDA graphs outside it), the total is raised to their sum and overhead is 0.
 */
export class VllmLogAccumulator implements EngineLogs {
  private readonly weights = new Map<string, number>()
  private readonly kvAvailable = new Map<string, number>()
  private readonly graphs = new Map<string, number>()
  private readonly v0Weights = new Map<string, number>()
  private readonly v0Kv = new Map<string, number>()
  private readonly v0Budget = new Map<string, number>()
  private readonly startupBudget = new Map<string, number>()
  private readonly kvcachedBudget = new Map<string, number>()
  private readonly startupGraphs = new Map<string, number>()
  private readonly startupKv = new Map<string, number>()
  private startup: StartupMemory | null = null
  private kvTokens: number | null = null
  private concurrency: number | null = null
  private concurrencyTokens: number | null = null
  private maxLen: number | null = null
  private currentPhase: LoadPhase = 'starting'
  private readonly errors = new ErrorLines(GENERIC_FAILURES)
  private freeMemoryError: FreeMemoryFailure | null = null
  private sleepFigures: SleepFigures | null = null
  private wakeSeconds: number | null = null
  private pid: number | null = null

  constructor(private readonly hints: MemoryHints = {}) {}

  /** feed takes one stdout or stderr line and returns the fact it carried, if any. */
  feed(line: string): VllmLogFact | null {
    const fact = parseVllmLine(line)
    if (fact) this.apply(fact)
    return fact
  }

  /**
   * observe: feed, and whether the line is uvicorn's `Application startup complete.`, vLLM's hint
   * that the server is about to answer (the port refuses connections until then).
   */
  observe(line: string): boolean {
    return this.feed(line)?.kind === 'app_startup_complete'
  }

  private apply(fact: VllmLogFact): void {
    const w = fact.worker ?? ''
    switch (fact.kind) {
      case 'weights':
        this.weights.set(w, fact.gib)
        break
      case 'kv_available':
        this.kvAvailable.set(w, fact.gib)
        break
      case 'kvcached_capacity':
        this.kvAvailable.set(w, fact.availableGib)
        this.kvcachedBudget.set(w, fact.budgetGib)
        break
      case 'kv_tokens':
        this.kvTokens = fact.tokens
        break
      case 'concurrency':
        this.concurrency = fact.concurrency
        this.concurrencyTokens = fact.tokensPerRequest
        break
      case 'kv_capacity':
        this.kvTokens = fact.tokens
        this.concurrency = fact.concurrency
        this.concurrencyTokens = fact.tokensPerRequest
        break
      case 'startup_memory':
        this.startupBudget.set(w, fact.desiredGib)
        if (fact.cudaGraphGib !== null) this.startupGraphs.set(w, fact.cudaGraphGib)
        if (fact.kvCacheGib !== null) this.startupKv.set(w, fact.kvCacheGib)
        if (this.startup === null || fact.freeGib < this.startup.freeGib) {
          const { freeGib, deviceTotalGib, utilization, desiredGib } = fact
          this.startup = { freeGib, deviceTotalGib, utilization, desiredGib }
        }
        break
      case 'cuda_graphs':
        this.graphs.set(w, fact.gib)
        break
      case 'max_model_len':
        this.maxLen = fact.tokens
        break
      case 'v0_budget':
        this.v0Budget.set(w, fact.budgetGib)
        break
      case 'v0_breakdown':
        this.v0Weights.set(w, fact.weightsGib)
        this.v0Kv.set(w, fact.kvCacheGib)
        break
      case 'sleep_freed':
        this.sleepFigures = { freedGib: fact.freedGib, stillInUseGib: fact.stillInUseGib, seconds: null }
        break
      case 'sleep_took':
        this.sleepFigures = { freedGib: 0, stillInUseGib: 0, ...this.sleepFigures, seconds: fact.seconds }
        break
      case 'wake_took':
        this.wakeSeconds = fact.seconds
        break
      case 'free_memory_error': {
        const { device, freeGib, deviceTotalGib, utilization, desiredGib, message } = fact
        this.freeMemoryError = {
          device: device ?? null,
          freeGib,
          deviceTotalGib,
          utilization,
          desiredGib,
          message,
        }
        this.errors.push(message)
        break
      }
      case 'server_started':
        this.pid = fact.pid
        break
      case 'error':
        this.errors.push(fact.message)
        break
    }
    const phase = fact.kind === 'phase' ? fact.phase : FACT_PHASE[fact.kind]
    this.currentPhase = laterPhase(this.currentPhase, phase)
  }

  /** phase is the furthest start-up phase the logs have shown; it never goes back. */
  phase(): LoadPhase {
    return this.currentPhase
  }

  /** progressPercent is PHASE_PROGRESS of the current phase: monotone, 100 only when ready. */
  progressPercent(): number {
    return PHASE_PROGRESS[this.currentPhase]
  }

  /** metrics is the memory split, or null until both weights and KV cache are known. */
  metrics(): MemoryMetrics | null {
    const weights = maxOf(this.weights) ?? maxOf(this.v0Weights)
    const kv = minOf(this.kvAvailable) ?? minOf(this.v0Kv) ?? minOf(this.startupKv)
    if (weights === null || kv === null) return null
    const graphs = Math.max(0, maxOf(this.graphs) ?? maxOf(this.startupGraphs) ?? 0)
    const parts = weights + graphs + kv
    const { gpuMemoryUtilization: util, deviceTotalGib: device } = this.hints
    const budget =
      util !== undefined && device !== undefined
        ? util * device
        : (maxOf(this.v0Budget) ?? maxOf(this.kvcachedBudget) ?? maxOf(this.startupBudget))
    const total = Math.max(budget ?? parts, parts)
    const maxModelLen = this.maxLen ?? this.concurrencyTokens ?? 0
    let perRequestMib = 0
    if (this.concurrency !== null && this.concurrency > 0) perRequestMib = (kv * 1024) / this.concurrency
    else if (this.kvTokens !== null && this.kvTokens > 0 && maxModelLen > 0) {
      perRequestMib = (kv * 1024) / (this.kvTokens / maxModelLen)
    }
    return {
      total_gpu_memory_gib: round4(total),
      weights_memory_gib: round4(weights),
      cuda_graph_memory_gib: round4(graphs),
      overhead_memory_gib: round4(total - parts),
      kv_cache_available_gib: round4(kv),
      kv_cache_per_request_mib: round4(perRequestMib),
      max_model_len: maxModelLen,
    }
  }

  /** workers lists each process's own figures (TP ranks), in the order they first reported. */
  workers(): WorkerMemory[] {
    const names = new Set([...this.weights.keys(), ...this.kvAvailable.keys(), ...this.graphs.keys()])
    return [...names].map((worker) => ({
      worker,
      weightsGib: this.weights.get(worker) ?? null,
      kvCacheAvailableGib: this.kvAvailable.get(worker) ?? null,
      cudaGraphGib: this.graphs.get(worker) ?? null,
    }))
  }

  /** maxModelLen is the context length the engine settled on, when it said so. */
  maxModelLen(): number | null {
    return this.maxLen ?? this.concurrencyTokens
  }

  /** kvCacheTokens is the engine's KV-cache capacity in tokens, when it said so. */
  kvCacheTokens(): number | null {
    return this.kvTokens
  }

  /** maxConcurrency is `Maximum concurrency for … tokens per request: Xx`, when it said so. */
  maxConcurrency(): number | null {
    return this.concurrency
  }

  /** startupMemory is the newer builds' start-up summary (free and desired memory), when printed. */
  startupMemory(): StartupMemory | null {
    return this.startup
  }

  /** freeMemoryFailure is vLLM's start-up refusal with its figures, when it refused. */
  freeMemoryFailure(): FreeMemoryFailure | null {
    return this.freeMemoryError
  }

  /** serverPid is the API server's pid from uvicorn's `Started server process [PID]`. */
  serverPid(): number | null {
    return this.pid
  }

  /** lastErrorLines returns up to n of the most recent error-ish messages, oldest first. */
  lastErrorLines(n: number): string[] {
    return this.errors.last(n)
  }

  /**
   * startupFailure is the message to show for a failed load: vLLM's free-memory refusal when seen,
   * else the last error line that names a cause (not a generic wrapper), else the last error line.
   */
  startupFailure(): string | null {
    if (this.freeMemoryError !== null) return this.freeMemoryError.message
    return this.errors.cause()
  }

  /** lastSleep is what the latest sleep freed and how long it took. */
  lastSleep(): SleepFigures | null {
    return this.sleepFigures
  }

  /** lastWakeSeconds is how long the latest wake-up took. */
  lastWakeSeconds(): number | null {
    return this.wakeSeconds
  }
}
