import type { EventBus } from '../../../src/host/bus.ts'
import { ReplayHub } from '../../../src/host/hub.ts'
import type { Logger } from '../../../src/host/logger.ts'
import type { ManagedInstance } from '../instance.ts'
import type { EngineFigures } from '../metrics.ts'
import { SAMPLE_INTERVAL_MS, TimeRing, type TimeSample } from './ring.ts'

/**
 * TimeSeriesSampler: every SAMPLE_INTERVAL_MS, one sample of what the dashboard draws over the last
 * hour without a Prometheus: requests and errors (5xx) per second, TTFT p50/p99, output tokens per
 * second, time held for a wake (p99), and per served model its KV-cache use and GPU memory.
 *
 * Requests come from the bus (`proxy.request`, `proxy.held`): per request a counter and one slot of
 * a fixed reservoir (RESERVOIR values per interval, replaced at random beyond it), so neither time
 * nor memory per request grows with traffic. Tokens and KV-cache use are read from each active
 * engine's own /metrics once per interval (one GET per engine); the engines' token counters also
 * feed Prometheus (`modelgate_model_*_tokens_total`, EngineFigures) as deltas, so an engine that
 * restarts or goes away never makes them go backwards.
 */
const RESERVOIR = 2048
const ENGINE_TIMEOUT_MS = 2000

/** Series names; per-model ones are `<prefix>/<served model name>`. */
export const SERIES = {
  requests: 'requests_per_second',
  errors: 'errors_per_second',
  ttftP50: 'ttft_p50_ms',
  ttftP99: 'ttft_p99_ms',
  tokens: 'tokens_per_second',
  queuedP99: 'queued_p99_ms',
  kvCache: 'kv_cache_usage',
  gpuMemory: 'gpu_memory_gib',
} as const

/** Reservoir: at most RESERVOIR values of one interval, a uniform sample of them beyond that. */
class Reservoir {
  private readonly values = new Float64Array(RESERVOIR)
  private seen = 0

  add(v: number): void {
    if (this.seen < RESERVOIR) this.values[this.seen] = v
    else {
      const i = Math.floor(Math.random() * (this.seen + 1))
      if (i < RESERVOIR) this.values[i] = v
    }
    this.seen++
  }

  /** take returns the p50 and p99 of the interval (null when empty) and starts the next one. */
  take(): { p50: number | null; p99: number | null } {
    const n = Math.min(this.seen, RESERVOIR)
    this.seen = 0
    if (n === 0) return { p50: null, p99: null }
    const sorted = this.values.slice(0, n).sort()
    const at = (q: number) => sorted[Math.min(n - 1, Math.ceil(q * n) - 1)]!
    return { p50: at(0.5), p99: at(0.99) }
  }
}

export interface SamplerDeps {
  bus: EventBus
  instances: () => Iterable<ManagedInstance>
  figures: EngineFigures
  log: Logger
}

export class TimeSeriesSampler {
  readonly ring = new TimeRing()
  /** samples: each new sample, for the dashboard's stream (no replay: it sends the ring first). */
  readonly samples = new ReplayHub<TimeSample>()
  private requests = 0
  private errors = 0
  private readonly ttft = new Reservoir()
  private readonly held = new Reservoir()
  /** The last generation and prompt token counters read from each engine. */
  private readonly counters = new Map<string, { generation: number; prompt: number }>()
  private timer: ReturnType<typeof setInterval> | null = null
  private offs: (() => void)[] = []
  private last = performance.now()
  private sampling = false

  constructor(private readonly deps: SamplerDeps) {}

  start(): void {
    if (this.timer) return
    this.offs = [
      this.deps.bus.on('proxy.request', (e) => {
        this.requests++
        if (e.status >= 500) this.errors++
        if (e.ttft_ms !== null) this.ttft.add(e.ttft_ms)
      }),
      this.deps.bus.on('proxy.held', (e) => this.held.add(e.held_ms)),
    ]
    this.last = performance.now()
    this.timer = setInterval(() => void this.sample(), SAMPLE_INTERVAL_MS)
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer)
    this.timer = null
    for (const off of this.offs) off()
    this.offs = []
  }

  /** sample takes one sample now (the timer's job; tests call it to avoid waiting). */
  async sample(): Promise<TimeSample | null> {
    if (this.sampling) return null
    this.sampling = true
    try {
      const now = performance.now()
      const seconds = Math.max(0.001, (now - this.last) / 1000)
      this.last = now
      const ttft = this.ttft.take()
      const held = this.held.take()
      const values: Record<string, number | null> = {
        [SERIES.requests]: this.requests / seconds,
        [SERIES.errors]: this.errors / seconds,
        [SERIES.ttftP50]: ttft.p50,
        [SERIES.ttftP99]: ttft.p99,
        [SERIES.queuedP99]: held.p99,
      }
      this.requests = 0
      this.errors = 0
      values[SERIES.tokens] = (await this.readEngines(values)) / seconds
      const sample = { t: Date.now(), values }
      this.ring.push(sample)
      this.samples.publish(sample)
      return sample
    } catch (err) {
      this.deps.log.warn('time series sample failed', { error: String(err) })
      return null
    } finally {
      this.sampling = false
    }
  }

  /**
   * readEngines adds each model's KV-cache use (mean over its active instances) and GPU memory (sum)
   * to `values`, feeds the token counters, and answers the output tokens generated since last time.
   */
  private async readEngines(values: Record<string, number | null>): Promise<number> {
    const instances = [...this.deps.instances()]
    const kv = new Map<string, number[]>()
    let tokens = 0
    await Promise.all(
      instances.map(async (inst) => {
        const model = inst.row.served_model_name
        const gib = inst.holdsGibByGpu()
        if (gib && inst.status !== 'failed') {
          const key = `${SERIES.gpuMemory}/${model}`
          values[key] = (values[key] ?? 0) + Object.values(gib).reduce((a, b) => a + b, 0)
        }
        if (inst.status !== 'active') return
        // The engine's counters under its own metric names (its driver's client knows them).
        const read = await inst.client.usage({ timeoutMs: ENGINE_TIMEOUT_MS }).catch(() => null)
        if (!read) return
        const { generationTokens: generation, promptTokens: prompt, kvCacheUsage: usage } = read
        if (usage !== null && usage !== undefined) kv.set(model, [...(kv.get(model) ?? []), usage])
        if (generation === null || generation === undefined) return
        const before = this.counters.get(inst.id)
        const now = { generation, prompt: prompt ?? 0 }
        this.counters.set(inst.id, now)
        // A counter that went down is a restarted engine: all it shows is new.
        const delta = (cur: number, prev: number | undefined) =>
          prev === undefined ? 0 : cur >= prev ? cur - prev : cur
        const out = delta(now.generation, before?.generation)
        tokens += out
        this.deps.figures.tokens(model, out, delta(now.prompt, before?.prompt))
      }),
    )
    const live = new Set(instances.map((i) => i.id))
    for (const id of this.counters.keys()) if (!live.has(id)) this.counters.delete(id)
    for (const [model, list] of kv) {
      const mean = list.reduce((a, b) => a + b, 0) / list.length
      values[`${SERIES.kvCache}/${model}`] = mean
      this.deps.figures.kvCacheUsage(model, mean)
    }
    this.deps.figures.kvCacheKeep(new Set(kv.keys()))
    return tokens
  }
}
