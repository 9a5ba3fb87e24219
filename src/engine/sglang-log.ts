/**
 * sglang-log turns the output of `python -m sglang.launch_server` (or `sglang serve`) into the facts
 * the gateway reads from every engine (engine-logs.ts): start-up phases, the memory split, the
 * start-up timings, the readiness hint and the failure line. Each line below is matched on the text
 * SGLang's own format strings produce, read in sgl-project/sglang: the current builds (0.5.15–0.5.18,
 * read in December 2026) and the older 0.4/0.5 wording, which is still accepted. test/fixtures/sglang/
 * holds whole start-up logs of each (test/engine/sglang-log.test.ts):
 *
 * - prefix: `[%(asctime)s{prefix}] %(message)s` (srt/utils configure_logger), the date `%Y-%m-%d
 *   %H:%M:%S` or `%m-%d %H:%M:%S`, the prefix naming the process: ` TP0`, ` DP0 TP0 EP0`, … for a
 *   scheduler (one per tensor-parallel rank), none for the main process. There is no level: an
 *   error is known by its text (a traceback, `…Error: …`, `Scheduler hit an exception`). uvicorn's
 *   lines come as `[date] INFO:     …` (set_uvicorn_logging_configs).
 * - weights: `Load weight begin. avail mem=78.50 GB`, then `Load weight end. elapsed=2.00 s, type=…,
 *   [quant=…, ]avail mem=…, mem usage=… GB.` (older: `Load weight end. type=…, dtype=…, avail mem=…,
 *   mem usage=… GB.`), model_executor/model_runner.py load_model. GB is 2^30 bytes
 *   (get_available_gpu_memory divides by 1 << 30). A speculative engine's draft model prints a second
 *   begin/end pair: the weights are the sum of both.
 * - KV cache, one line per pool (mem_cache/memory_pool.py `_finalize_allocation_log`): `KV Cache is
 *   allocated. dtype: torch.bfloat16, #tokens: 535124, K size: 16.33 GB, V size: 16.33 GB` (MHA) or
 *   `… #tokens: N, KV size: X GB` (MLA); older builds print no `dtype:`. A draft model has its own
 *   pool (a second line); the KV cache is the sum of the pools. Hybrid models add their state:
 *   `Mamba Cache is allocated. max_mamba_cache_size: 117, conv_state size: 0.28GB, ssm_state size:
 *   8.07GB` (more `… size: XGB` figures with speculative decoding; every one counts), and a
 *   sliding-window model's `SWAKVPool mem usage: 36.69 GB, swa size: 171008, full size: 213761`
 *   (mem_cache/swa_memory_pool.py), printed after its two inner pools' own KV lines and standing for
 *   them (counted once). `Memory pool end. avail mem=… GB` after each pool.
 * - CUDA graphs (model_runner.py, the graph runners): `Capture target decode
 *   CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[…], avail mem=… GB` and `Capture
 *   target decode CUDA graph end. elapsed=30.54 s, mem usage=1.38 GB, avail mem=19.66 GB.`, one pair
 *   per graph set (target or draft × prefill, decode, verify, extend); older builds: `Capture cuda graph
 *   begin. This can take up to several minutes. avail mem=… GB` and `Capture cuda graph end. Time
 *   elapsed: 6.52 s. mem usage=0.60 GB. avail mem=7.68 GB.` (the oldest: no figures). The CUDA-graph
 *   figure is the sum of every set's `mem usage`.
 * - `mem usage` is the free memory before less after, so it can be negative (`mem usage=-1.86 GB`:
 *   the step gave back more than it took, e.g. a draft model's load after the target's loader freed
 *   its buffers). The fact keeps the sign; in the memory split each part is the sum of its lines with
 *   their signs (what the GPU really lost to it), and a part whose sum is negative counts as 0: no
 *   figure of the split is ever negative.
 * - the scheduler's summary: `max_total_num_tokens=…, chunked_prefill_size=…, max_prefill_tokens=…,
 *   max_running_requests=…, context_len=…, available_gpu_mem=… GB` (managers/scheduler.py).
 * - start-up timings (current builds, the main process): `Engine startup timings (s): load_weight=12.02,
 *   kv_cache_allocation=0.02, scheduler_e2e=52.09, cuda_graph={prefill=22.96, decode=12.26, …},
 *   tokenizer_e2e=65.82` (any of the phases may be missing); `startupTimings()` gives them.
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
  type StartupTimings,
} from './engine-logs.ts'

/** SglangLogLine: one output line split into its process prefix (` TP1`…) and message. */
export interface SglangLogLine {
  /** rank is the prefix after the timestamp (`TP1`, `DP0 TP0 EP0`), null for the main process */
  rank: string | null
  message: string
}

/**
 * SglangStartupTimings: the main process's `Engine startup timings (s)` line, in seconds:
 * totalSeconds is the whole start-up as the server saw it (`tokenizer_e2e`, else the scheduler's
 * `scheduler_e2e`), loadWeightsSeconds `load_weight` (the target's weights and a draft's).
 */
export interface SglangStartupTimings extends StartupTimings {
  /** every phase named, the CUDA-graph ones as `cuda_graph.decode`, `cuda_graph.target_verify`, … */
  phases: Record<string, number>
}

export type SglangLogFact =
  | { kind: 'weights_begin'; availGib: number }
  | { kind: 'weights'; gib: number; availGib: number | null }
  | { kind: 'kv_cache'; tokens: number; gib: number; dtype: string | null }
  | { kind: 'swa_kv_pool'; gib: number; swaTokens: number; fullTokens: number }
  | { kind: 'mamba_cache'; gib: number; slots: number }
  | { kind: 'memory_pool_end'; availGib: number }
  | { kind: 'graphs_begin'; graph: string | null; availGib: number | null }
  | { kind: 'graphs'; graph: string | null; seconds: number; gib: number | null; availGib: number | null }
  | {
      kind: 'scheduler'
      maxTotalTokens: number
      contextLen: number
      availGib: number | null
    }
  | ({ kind: 'startup_timings' } & SglangStartupTimings)
  | { kind: 'server_started'; pid: number }
  | { kind: 'ready' }
  | { kind: 'phase'; phase: LoadPhase }
  | { kind: 'error'; message: string }

const N = String.raw`(\d[\d,]*(?:\.\d+)?)`
/** A `mem usage` figure: free before less free after, so it may be negative. */
const SN = String.raw`(-?\d[\d,]*(?:\.\d+)?)`
/** `[2025-05-01 10:00:00 TP0] `, `[05-01 10:00:00] `, with a prefix of rank tags or none. */
const PREFIX = /^\[(?:\d{4}-)?\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?((?: [A-Z]+\d+)*)\]\s?/
const UVICORN = /^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+/
const EXCEPTION_LINE = /^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::.*)?$/
/** Wrappers that point at a cause printed elsewhere; a root-cause line is preferred. */
const GENERIC_FAILURES =
  /^Traceback|^Scheduler hit an exception|^Received sigquit from a child process|^Initialization failed|^Killed$/

const num = (s: string | undefined): number => Number((s ?? '').replace(/,/g, ''))
const opt = (s: string | undefined): number | null => (s === undefined ? null : num(s))
const re = (source: string, flags = ''): RegExp => new RegExp(source, flags)

type Rule = [RegExp, (m: RegExpMatchArray) => SglangLogFact]

/** startupTimings reads `load_weight=12.02, …, cuda_graph={prefill=22.96, decode=12.26}, tokenizer_e2e=65.82`. */
function startupTimings(text: string): SglangStartupTimings {
  const phases: Record<string, number> = {}
  const flat = text.replace(/(\w+)=\{([^}]*)\}/g, (_all, group: string, inner: string) => {
    for (const [, k, v] of inner.matchAll(/(\w+)=(-?\d+(?:\.\d+)?)/g)) phases[`${group}.${k}`] = Number(v)
    return ''
  })
  for (const [, k, v] of flat.matchAll(/(\w+)=(-?\d+(?:\.\d+)?)/g)) phases[k!] = Number(v)
  return {
    totalSeconds: phases['tokenizer_e2e'] ?? phases['scheduler_e2e'] ?? null,
    loadWeightsSeconds: phases['load_weight'] ?? null,
    phases,
  }
}

const RULES: Rule[] = [
  [re(`^Load weight begin\\. avail mem=${N} GB`), (m) => ({ kind: 'weights_begin', availGib: num(m[1]) })],
  [
    re(`^Load weight end\\..*?(?:avail mem=${N} GB, )?mem usage=${SN} GB`),
    (m) => ({ kind: 'weights', gib: num(m[2]), availGib: opt(m[1]) }),
  ],
  [
    re(`^KV Cache is allocated\\. (?:dtype: (\\S+), )?#tokens: ${N}, K size: ${N} GB, V size: ${N} GB`),
    (m) => ({
      kind: 'kv_cache',
      tokens: num(m[2]),
      gib: round4(num(m[3]) + num(m[4])),
      dtype: m[1] ?? null,
    }),
  ],
  [
    re(`^KV Cache is allocated\\. (?:dtype: (\\S+), )?#tokens: ${N}, KV size: ${N} GB`),
    (m) => ({ kind: 'kv_cache', tokens: num(m[2]), gib: num(m[3]), dtype: m[1] ?? null }),
  ],
  [
    re(`^SWAKVPool mem usage: ${N} GB, swa size: ${N}, full size: ${N}`),
    (m) => ({ kind: 'swa_kv_pool', gib: num(m[1]), swaTokens: num(m[2]), fullTokens: num(m[3]) }),
  ],
  [
    re(`^Mamba Cache(?: \\([^)]*\\))? is allocated\\. max_mamba_cache_size: ${N}(.*)$`),
    (m) => {
      let total = 0
      for (const [, x] of (m[2] ?? '').matchAll(re(`size: ${N}\\s?GB`, 'g'))) total += num(x)
      return { kind: 'mamba_cache', slots: num(m[1]), gib: round4(total) }
    },
  ],
  [re(`^Memory pool end\\. avail mem=${N} GB`), (m) => ({ kind: 'memory_pool_end', availGib: num(m[1]) })],
  [
    re(`^Capture (?:(\\w+(?: \\w+)?) )?cuda graph begin\\.(?:.*?avail mem=${N} GB)?`, 'i'),
    (m) => ({ kind: 'graphs_begin', graph: m[1] ?? null, availGib: opt(m[2]) }),
  ],
  [
    re(
      `^Capture (\\w+(?: \\w+)?) CUDA graph end\\. elapsed=${N} s(?:, mem usage=${SN} GB)?(?:, avail mem=${N} GB)?`,
    ),
    (m) => ({ kind: 'graphs', graph: m[1] ?? null, seconds: num(m[2]), gib: opt(m[3]), availGib: opt(m[4]) }),
  ],
  [
    re(
      `^Capture cuda graph end\\. Time elapsed: ${N} s(?:\\. mem usage=${SN} GB)?(?:\\. avail mem=${N} GB)?`,
    ),
    (m) => ({ kind: 'graphs', graph: null, seconds: num(m[1]), gib: opt(m[2]), availGib: opt(m[3]) }),
  ],
  [
    re(`^max_total_num_tokens=${N},.*?context_len=${N}(?:.*?available_gpu_mem=${N} GB)?`),
    (m) => ({
      kind: 'scheduler',
      maxTotalTokens: num(m[1]),
      contextLen: num(m[2]),
      availGib: opt(m[3]),
    }),
  ],
  [
    /^Engine startup timings \(s\):\s*(.*)$/,
    (m) => ({ kind: 'startup_timings', ...startupTimings(m[1] ?? '') }),
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
  swa_kv_pool: 'kv_cache',
  mamba_cache: 'kv_cache',
  memory_pool_end: 'kv_cache',
  graphs_begin: 'cuda_graphs',
  graphs: 'cuda_graphs',
  scheduler: 'cuda_graphs',
  startup_timings: 'cuda_graphs',
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

/** nonNegative: per-rank sums with a negative one (more given back than taken) as 0. */
const nonNegative = (m: Map<string, number>): Map<string, number> =>
  new Map([...m].map(([rank, n]) => [rank, Math.max(0, n)]))

/** A KV pool of one rank: its size in tokens (null for a hybrid model's state) and GiB. */
interface Pool {
  tokens: number | null
  gib: number
}

/**
 * SglangLogAccumulator follows one SGLang server's output. Figures are per GPU: each
 * tensor-parallel rank's scheduler logs its own, and the largest weights and CUDA-graph figures and
 * the smallest KV cache are kept (every rank's pool holds the same number of tokens).
 *
 * Within a rank, every part is summed over what the engine allocated: the weights of the target and
 * of a draft model (each `Load weight end`), the KV cache of every pool (the target's, a draft's, a
 * hybrid model's Mamba state; a `SWAKVPool` line stands for the two inner pools printed just before
 * it), the CUDA graphs of every captured set. A negative `mem usage` is memory a step gave back to
 * the part counted before it (the target's load buffers, freed while the draft loads), so it is
 * summed with its sign; a part is never less than 0.
 *
 * The total footprint is what the engine took from the GPU between the first `Load weight begin`
 * and the last free-memory figure it printed (after the CUDA graphs, or the scheduler's summary):
 * SGLang sizes its static pool as a share of the memory free when it starts (`--mem-fraction-static`
 * × free, model_runner memory profiling), not of the whole device, so the launch's fraction × device
 * would not be it. Without both figures the total is weights + CUDA graphs + KV cache; what the
 * total holds beyond the three parts is overhead. KV per request = KV cache ÷ (pool tokens ÷ context
 * length); the pool's tokens are the first pool's `#tokens` (a sliding-window model's full size),
 * else the scheduler's max_total_num_tokens.
 */
export class SglangLogAccumulator implements EngineLogs {
  private readonly weights = new Map<string, number>()
  private readonly pools = new Map<string, Pool[]>()
  private readonly graphs = new Map<string, number>()
  private readonly availBegin = new Map<string, number>()
  private readonly availEnd = new Map<string, number>()
  private readonly graphsBegin = new Map<string, number>()
  private tokens: number | null = null
  private swaTokensTaken = false
  private contextLen: number | null = null
  private timings: SglangStartupTimings | null = null
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

  private add(map: Map<string, number>, r: string, n: number): void {
    map.set(r, round4((map.get(r) ?? 0) + n))
  }

  private poolsOf(r: string): Pool[] {
    const list = this.pools.get(r) ?? []
    this.pools.set(r, list)
    return list
  }

  private apply(fact: SglangLogFact, r: string): void {
    switch (fact.kind) {
      case 'weights_begin':
        if (!this.availBegin.has(r)) this.availBegin.set(r, fact.availGib)
        break
      case 'weights':
        this.add(this.weights, r, fact.gib)
        if (fact.availGib !== null) this.availEnd.set(r, fact.availGib)
        break
      case 'kv_cache':
        this.poolsOf(r).push({ tokens: fact.tokens, gib: fact.gib })
        this.tokens ??= fact.tokens
        break
      case 'swa_kv_pool': {
        // The sliding-window and full pools logged their own lines just before: this one replaces them.
        const list = this.poolsOf(r)
        const inner = [fact.swaTokens, fact.fullTokens]
        for (let i = list.length - 1; i >= 0 && inner.length > 0; i--) {
          const at = inner.indexOf(list[i]!.tokens ?? -1)
          if (at < 0) break
          inner.splice(at, 1)
          list.splice(i, 1)
        }
        list.push({ tokens: fact.fullTokens, gib: fact.gib })
        if (!this.swaTokensTaken) this.tokens = fact.fullTokens
        this.swaTokensTaken = true
        break
      }
      case 'mamba_cache':
        this.poolsOf(r).push({ tokens: null, gib: fact.gib })
        break
      case 'memory_pool_end':
        this.availEnd.set(r, fact.availGib)
        break
      case 'graphs_begin':
        if (fact.availGib !== null) this.graphsBegin.set(r, fact.availGib)
        break
      case 'graphs': {
        const begin = this.graphsBegin.get(r)
        const used =
          fact.gib ?? (begin !== undefined && fact.availGib !== null ? begin - fact.availGib : null)
        if (used !== null) this.add(this.graphs, r, used)
        this.graphsBegin.delete(r)
        if (fact.availGib !== null) this.availEnd.set(r, fact.availGib)
        break
      }
      case 'scheduler':
        this.tokens ??= fact.maxTotalTokens
        this.contextLen = fact.contextLen
        if (fact.availGib !== null) this.availEnd.set(r, fact.availGib)
        break
      case 'startup_timings': {
        const { kind: _, ...timings } = fact
        this.timings = timings
        break
      }
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

  /** kvByRank: each rank's KV cache, the sum of its pools. */
  private kvByRank(): Map<string, number> {
    const out = new Map<string, number>()
    for (const [rank, list] of this.pools) out.set(rank, round4(list.reduce((sum, p) => sum + p.gib, 0)))
    return out
  }

  metrics(): MemoryMetrics | null {
    const weights = maxOf(nonNegative(this.weights))
    const kv = minOf(nonNegative(this.kvByRank()))
    if (weights === null || kv === null) return null
    const graphs = maxOf(nonNegative(this.graphs)) ?? 0
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

  /**
   * startupTimings: the phases of `Engine startup timings (s)` (current builds print it once the
   * scheduler is up), null until then or from a build that does not print it.
   */
  startupTimings(): SglangStartupTimings | null {
    return this.timings
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
