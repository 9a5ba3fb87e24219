/**
 * sglang-log turns the output of `python -m sglang.launch_server` into the facts the gateway reads
 * from every engine (engine-logs.ts): start-up phases, the memory split, the readiness hint and
 * the failure line. Each line below is matched on the text SGLang's own format strings produce (read
 * in sgl-project/sglang, 2025–2026 builds; the older wording is accepted too), and test/fixtures/sglang/
 * holds whole start-up logs assembled from them (test/engine/sglang-log.test.ts):
 *
 * - prefix: `[%(asctime)s{prefix}] %(message)s` (srt/utils configure_logger), the date `%Y-%m-%d
 *   %H:%M:%S` (older) or `%m-%d %H:%M:%S` (newer), the prefix naming the process: ` TP0`, ` DP0 TP0
 *   EP0`, … for a scheduler (one per tensor-parallel rank), none for the main process. There is no
 *   level: an error is known by its text (a traceback, `…Error: …`, `Scheduler hit an exception`).
 *   uvicorn's lines come as `[date] INFO:     …` (set_uvicorn_logging_configs).
 * - weights: `Load weight begin. avail mem=78.50 GB`, then `Load weight end. type=…, dtype=…, avail
 *   mem=63.46 GB, mem usage=15.04 GB.` (newer: `Load weight end. elapsed=2.00 s, type=…, [quant, ]avail
 *   mem=…, mem usage=… GB.`), model_executor/model_runner.py load_model. GB is 2^30 bytes
 *   (get_available_gpu_memory divides by 1 << 30).
 * - KV cache: `KV Cache is allocated. #tokens: 437200, K size: 26.69 GB, V size: 26.69 GB` (MHA) or
 *   `… #tokens: N, KV size: X GB` (MLA), mem_cache/memory_pool.py; `Memory pool end. avail mem=… GB`.
 * - CUDA graphs: `Capture cuda graph begin. This can take up to several minutes. avail mem=… GB`, then
 *   `Capture cuda graph end. Time elapsed: 6.52 s. mem usage=0.60 GB. avail mem=7.68 GB.` (older: no
 *   figures), model_runner.py init_device_graphs.
 * - the scheduler's summary: `max_total_num_tokens=…, chunked_prefill_size=…, max_prefill_tokens=…,
 *   max_running_requests=…, context_len=…, available_gpu_mem=… GB` (managers/scheduler.py).
 * - readiness: `The server is fired up and ready to roll!` (entrypoints/http_server.py
 *   _wait_and_warmup), after the warmup request; /health answers 503 until then although the port is
 *   open (uvicorn's `Application startup complete.` comes before the warmup).
 * - failures: `RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.`
 *   (model_runner memory pool); `Scheduler hit an exception: Traceback …` and `Received sigquit from a
 *   child process. It usually means the child failed.` are wrappers around the real cause.
 */
import { stripAnsi } from './ansi.ts'
import {
  type EngineLogs,
  ErrorLines,
  type LoadPhase,
  laterPhase,
  type MemoryMetrics,
  maxOf,
  minOf,
  PHASE_PROGRESS,
  round4,
} from './engine-logs.ts'

/** SglangLogLine: one output line split into its process prefix (` TP1`…) and message. */
export interface SglangLogLine {
  /** rank is the prefix after the timestamp (`TP1`, `DP0 TP0 EP0`), null for the main process */
  rank: string | null
  message: string
}

export type SglangLogFact =
  | { kind: 'weights_begin'; availGib: number }
  | { kind: 'weights'; gib: number; availGib: number | null }
  | { kind: 'kv_cache'; tokens: number; gib: number }
  | { kind: 'memory_pool_end'; availGib: number }
  | { kind: 'graphs_begin'; availGib: number | null }
  | { kind: 'graphs'; gib: number | null; availGib: number | null }
  | {
      kind: 'scheduler'
      maxTotalTokens: number
      contextLen: number
      availGib: number | null
    }
  | { kind: 'server_started'; pid: number }
  | { kind: 'ready' }
  | { kind: 'phase'; phase: LoadPhase }
  | { kind: 'error'; message: string }

const N = String.raw`(\d[\d,]*(?:\.\d+)?)`
/** `[2025-05-01 10:00:00 TP0] `, `[05-01 10:00:00] `, with a prefix of rank tags or none. */
const PREFIX = /^\[(?:\d{4}-)?\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?((?: [A-Z]+\d+)*)\]\s?/
const UVICORN = /^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+/
const EXCEPTION_LINE = /^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::.*)?$/
/** Wrappers that point at a cause printed elsewhere; a root-cause line is preferred. */
const GENERIC_FAILURES =
  /^Traceback|^Scheduler hit an exception|^Received sigquit from a child process|^Initialization failed|^Killed$/

const num = (s: string | undefined): number => Number((s ?? '').replace(/,/g, ''))
const re = (source: string): RegExp => new RegExp(source)

type Rule = [RegExp, (m: RegExpMatchArray) => SglangLogFact]

const RULES: Rule[] = [
  [re(`^Load weight begin\\. avail mem=${N} GB`), (m) => ({ kind: 'weights_begin', availGib: num(m[1]) })],
  [
    re(`^Load weight end\\..*?(?:avail mem=${N} GB, )?mem usage=${N} GB`),
    (m) => ({ kind: 'weights', gib: num(m[2]), availGib: m[1] === undefined ? null : num(m[1]) }),
  ],
  [
    re(`^KV Cache is allocated\\. #tokens: ${N}, K size: ${N} GB, V size: ${N} GB`),
    (m) => ({ kind: 'kv_cache', tokens: num(m[1]), gib: round4(num(m[2]) + num(m[3])) }),
  ],
  [
    re(`^KV Cache is allocated\\. #tokens: ${N}, KV size: ${N} GB`),
    (m) => ({ kind: 'kv_cache', tokens: num(m[1]), gib: num(m[2]) }),
  ],
  [re(`^Memory pool end\\. avail mem=${N} GB`), (m) => ({ kind: 'memory_pool_end', availGib: num(m[1]) })],
  [
    re(`^Capture cuda graph begin\\.(?:.*?avail mem=${N} GB)?`),
    (m) => ({ kind: 'graphs_begin', availGib: m[1] === undefined ? null : num(m[1]) }),
  ],
  [
    re(`^Capture cuda graph end\\. Time elapsed: ${N} s(?:\\. mem usage=${N} GB)?(?:\\. avail mem=${N} GB)?`),
    (m) => ({
      kind: 'graphs',
      gib: m[2] === undefined ? null : num(m[2]),
      availGib: m[3] === undefined ? null : num(m[3]),
    }),
  ],
  [
    re(`^max_total_num_tokens=${N},.*?context_len=${N}(?:.*?available_gpu_mem=${N} GB)?`),
    (m) => ({
      kind: 'scheduler',
      maxTotalTokens: num(m[1]),
      contextLen: num(m[2]),
      availGib: m[3] === undefined ? null : num(m[3]),
    }),
  ],
  [/^Started server process \[(\d+)\]/, (m) => ({ kind: 'server_started', pid: num(m[1]) })],
  [/^The server is fired up and ready to roll!/, () => ({ kind: 'ready' })],
]

/** PHASE_HINTS: lines that carry no figure but show which phase has begun. */
const PHASE_HINTS: [RegExp, LoadPhase][] = [
  [/^Init torch distributed|^Loading (?:safetensors|pt) checkpoint shards/, 'loading_weights'],
  [/^Application startup complete|^Uvicorn running on|^Waiting for application startup/, 'api_server'],
]

/** FACT_PHASE: the phase a fact shows has begun. */
const FACT_PHASE: Partial<Record<SglangLogFact['kind'], LoadPhase>> = {
  weights_begin: 'loading_weights',
  weights: 'profiling',
  kv_cache: 'kv_cache',
  memory_pool_end: 'kv_cache',
  graphs_begin: 'cuda_graphs',
  graphs: 'cuda_graphs',
  scheduler: 'cuda_graphs',
  server_started: 'api_server',
  ready: 'ready',
}

/** splitSglangLine strips ANSI codes, a carriage-return progress bar, the timestamp and rank prefix. */
export function splitSglangLine(line: string): SglangLogLine {
  const segments = stripAnsi(line).split('\r')
  let text = (segments.findLast((s) => s.trim() !== '') ?? '').trim()
  let rank: string | null = null
  const prefix = PREFIX.exec(text)
  if (prefix) {
    rank = prefix[1]?.trim() || null
    text = text.slice(prefix[0].length)
  }
  const uvicorn = UVICORN.exec(text)
  if (uvicorn) text = text.slice(uvicorn[0].length)
  return { rank, message: text.trim() }
}

function isErrorLine(message: string): boolean {
  return (
    EXCEPTION_LINE.test(message) ||
    message.startsWith('Scheduler hit an exception') ||
    message.startsWith('Received sigquit from a child process') ||
    message.includes('CUDA out of memory') ||
    /^launch_server\.py: error: /.test(message)
  )
}

/** parseSglangLine reads one output line of an SGLang server; null when it carries nothing known. */
export function parseSglangLine(line: string): (SglangLogFact & { rank: string | null }) | null {
  const { rank, message } = splitSglangLine(line)
  if (message === '') return null
  for (const [pattern, build] of RULES) {
    const m = message.match(pattern)
    if (m) return { ...build(m), rank }
  }
  if (isErrorLine(message)) return { kind: 'error', message, rank }
  for (const [pattern, phase] of PHASE_HINTS) if (pattern.test(message)) return { kind: 'phase', phase, rank }
  return null
}

/**
 * SglangLogAccumulator follows one SGLang server's output. Figures are per GPU: each
 * tensor-parallel rank's scheduler logs its own, and the largest weights and CUDA-graph figures and
 * the smallest KV cache are kept (every rank's pool holds the same number of tokens).
 *
 * The total footprint is what the engine took from the GPU between `Load weight begin` and the
 * last free-memory figure it printed (after the CUDA graphs, or the scheduler's summary): SGLang
 * sizes its static pool as a share of the memory free when it starts (`--mem-fraction-static` ×
 * free, model_runner memory profiling), not of the whole device, so the launch's fraction × device
 * would not be it. Without both figures the total is weights + CUDA graphs + KV cache. KV per
 * request = KV cache ÷ (pool tokens ÷ context length).
 */
export class SglangLogAccumulator implements EngineLogs {
  private readonly weights = new Map<string, number>()
  private readonly kv = new Map<string, number>()
  private readonly graphs = new Map<string, number>()
  private readonly availBegin = new Map<string, number>()
  private readonly availEnd = new Map<string, number>()
  private readonly graphsBegin = new Map<string, number>()
  private tokens: number | null = null
  private contextLen: number | null = null
  private currentPhase: LoadPhase = 'starting'
  private readonly errors = new ErrorLines(GENERIC_FAILURES)

  /** feed takes one line and returns the fact it carried, if any. */
  feed(line: string): SglangLogFact | null {
    const fact = parseSglangLine(line)
    if (fact) this.apply(fact, fact.rank ?? '')
    return fact
  }

  /** observe: feed, and whether the line is `The server is fired up and ready to roll!`. */
  observe(line: string): boolean {
    return this.feed(line)?.kind === 'ready'
  }

  private apply(fact: SglangLogFact, r: string): void {
    switch (fact.kind) {
      case 'weights_begin':
        this.availBegin.set(r, fact.availGib)
        break
      case 'weights':
        this.weights.set(r, fact.gib)
        if (fact.availGib !== null) this.availEnd.set(r, fact.availGib)
        break
      case 'kv_cache':
        this.kv.set(r, fact.gib)
        this.tokens = fact.tokens
        break
      case 'memory_pool_end':
        this.availEnd.set(r, fact.availGib)
        break
      case 'graphs_begin':
        if (fact.availGib !== null) this.graphsBegin.set(r, fact.availGib)
        break
      case 'graphs': {
        const begin = this.graphsBegin.get(r)
        const gib = fact.gib ?? (begin !== undefined && fact.availGib !== null ? begin - fact.availGib : null)
        if (gib !== null) this.graphs.set(r, Math.max(0, gib))
        if (fact.availGib !== null) this.availEnd.set(r, fact.availGib)
        break
      }
      case 'scheduler':
        this.tokens ??= fact.maxTotalTokens
        this.contextLen = fact.contextLen
        if (fact.availGib !== null) this.availEnd.set(r, fact.availGib)
        break
      case 'error':
        this.errors.push(fact.message)
        break
    }
    this.currentPhase = laterPhase(
      this.currentPhase,
      fact.kind === 'phase' ? fact.phase : FACT_PHASE[fact.kind],
    )
  }

  phase(): LoadPhase {
    return this.currentPhase
  }

  progressPercent(): number {
    return PHASE_PROGRESS[this.currentPhase]
  }

  /** taken: per rank, the free memory at `Load weight begin` less the last free figure. */
  private taken(): number | null {
    let most: number | null = null
    for (const [rank, begin] of this.availBegin) {
      const end = this.availEnd.get(rank)
      if (end !== undefined) most = Math.max(most ?? 0, begin - end)
    }
    return most
  }

  metrics(): MemoryMetrics | null {
    const weights = maxOf(this.weights)
    const kv = minOf(this.kv)
    if (weights === null || kv === null) return null
    const graphs = maxOf(this.graphs) ?? 0
    const parts = weights + graphs + kv
    const total = Math.max(this.taken() ?? parts, parts)
    const maxModelLen = this.contextLen ?? 0
    const perRequestMib =
      this.tokens !== null && this.tokens > 0 && maxModelLen > 0
        ? (kv * 1024) / (this.tokens / maxModelLen)
        : 0
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

  maxModelLen(): number | null {
    return this.contextLen
  }

  /** kvCacheTokens: the pool's size in tokens (`#tokens`, or max_total_num_tokens). */
  kvCacheTokens(): number | null {
    return this.tokens
  }

  lastErrorLines(n: number): string[] {
    return this.errors.last(n)
  }

  startupFailure(): string | null {
    return this.errors.cause()
  }
}
