/**
 * EngineMetrics keeps the counters and histograms vLLM exposes on `/metrics` and renders them in
 * Prometheus text format with vLLM's names and labels (`model_name`, `engine`). Histogram and the
 * number format are shared with the other engine kinds' metrics.
 */
/** InferenceMetrics: what a generation records, whatever names the engine exports them under. */
export interface InferenceMetrics {
  generationTokens: number
  firstToken(seconds: number, promptTokens: number): void
  finish(reason: 'stop' | 'length' | 'abort', seconds: number): void
}

export const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640,
  2560,
]
export const E2E_BUCKETS = [
  0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680,
]

export function num(x: number): string {
  return Number.isInteger(x) ? x.toFixed(1) : String(x)
}

export class Histogram {
  private readonly counts: number[]
  private sum = 0
  private count = 0

  constructor(private readonly buckets: number[]) {
    this.counts = buckets.map(() => 0)
  }

  observe(value: number): void {
    this.sum += value
    this.count++
    for (let i = 0; i < this.buckets.length; i++) if (value <= (this.buckets[i] ?? 0)) this.counts[i]!++
  }

  render(name: string, help: string, labels: string): string {
    let out = `# HELP ${name} ${help}\n# TYPE ${name} histogram\n`
    out += `${name}_sum{${labels}} ${num(this.sum)}\n`
    for (let i = 0; i < this.buckets.length; i++) {
      out += `${name}_bucket{${labels},le="${num(this.buckets[i] ?? 0)}"} ${num(this.counts[i] ?? 0)}\n`
    }
    out += `${name}_bucket{${labels},le="+Inf"} ${num(this.count)}\n`
    out += `${name}_count{${labels}} ${num(this.count)}\n`
    return out
  }
}

export interface LiveFigures {
  running: number
  waiting: number
  kvUsage: number
  /** The state of each sleep component (current builds' `vllm:engine_sleep_component_state`). */
  components?: SleepComponents
}

export interface SleepComponents {
  scheduler: 'running' | 'paused'
  weights: 'resident' | 'offloaded' | 'discarded'
  kv_cache: 'resident' | 'discarded'
}

const COMPONENT_STATES: [keyof SleepComponents, string][] = [
  ['scheduler', 'running'],
  ['scheduler', 'paused'],
  ['weights', 'resident'],
  ['weights', 'offloaded'],
  ['weights', 'discarded'],
  ['kv_cache', 'resident'],
  ['kv_cache', 'discarded'],
]

/** vLLM's buckets for the sleep-mode operations (`rl_sleep_mode` metrics). */
const SLEEP_OPERATION_BUCKETS = [0.01, 0.1, 1, 10, 30, 60, 120, 300, 600]
export type SleepOperation = 'sleep' | 'wake' | 'release_kv_cache_memory'

export class EngineMetrics implements InferenceMetrics {
  promptTokens = 0
  generationTokens = 0
  readonly finished: Record<string, number> = { stop: 0, length: 0, abort: 0 }
  private readonly ttft = new Histogram(TTFT_BUCKETS)
  private readonly e2e = new Histogram(E2E_BUCKETS)
  private lastPrompt = 0
  private lastGeneration = 0
  private lastAt = performance.now()
  /** vllm:engine_sleep_state, as record_sleep_state(sleep, level) leaves it (awake at start). */
  private sleepState = { awake: 1, weights_offloaded: 0, discard_all: 0 }
  private readonly operations = new Map<SleepOperation, Histogram>()

  constructor(
    private readonly modelName: string,
    private readonly withSleepState = false,
  ) {}

  /** recordSleepState mirrors vLLM: a sleep sets (1, level), every wake_up call (0, 0). */
  recordSleepState(sleep: 0 | 1, level: number): void {
    this.sleepState = {
      awake: sleep === 1 ? 0 : 1,
      weights_offloaded: sleep === 1 && level === 1 ? 1 : 0,
      discard_all: sleep === 1 && level === 2 ? 1 : 0,
    }
  }

  /** recordOperation: one sleep-mode operation's duration (current builds' histogram). */
  recordOperation(operation: SleepOperation, seconds: number): void {
    const h = this.operations.get(operation) ?? new Histogram(SLEEP_OPERATION_BUCKETS)
    this.operations.set(operation, h)
    h.observe(seconds)
  }

  firstToken(seconds: number, promptTokens: number): void {
    this.ttft.observe(seconds)
    this.promptTokens += promptTokens
  }

  finish(reason: 'stop' | 'length' | 'abort', seconds: number): void {
    this.finished[reason] = (this.finished[reason] ?? 0) + 1
    if (reason !== 'abort') this.e2e.observe(seconds)
  }

  render(live: LiveFigures): string {
    const labels = `model_name="${this.modelName.replaceAll('\\', '\\\\').replaceAll('"', '\\"')}",engine="0"`
    const gauge = (name: string, help: string, value: number) =>
      `# HELP ${name} ${help}\n# TYPE ${name} gauge\n${name}{${labels}} ${num(value)}\n`
    const counter = (name: string, help: string, value: number) =>
      `# HELP ${name} ${help}\n# TYPE ${name} counter\n${name}{${labels}} ${num(value)}\n`
    let out = ''
    out += gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', live.running)
    out += gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', live.waiting)
    out += gauge('vllm:kv_cache_usage_perc', 'KV-cache usage. 1 means 100 percent usage.', live.kvUsage)
    if (this.withSleepState) {
      out +=
        '# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means ' +
        'engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n' +
        '# TYPE vllm:engine_sleep_state gauge\n'
      for (const [state, value] of Object.entries(this.sleepState))
        out += `vllm:engine_sleep_state{${labels},sleep_state="${state}"} ${num(value)}\n`
    }
    if (live.components) {
      const c = live.components
      out +=
        '# HELP vllm:engine_sleep_component_state Sleep state of each engine component.\n' +
        '# TYPE vllm:engine_sleep_component_state gauge\n'
      for (const [component, state] of COMPONENT_STATES)
        out += `vllm:engine_sleep_component_state{${labels},component="${component}",state="${state}"} ${num(c[component] === state ? 1 : 0)}\n`
      // The operations are timed in the API server, labelled by operation only.
      const name = 'vllm:rl_sleep_mode_operation_duration_seconds'
      out += `# HELP ${name} Duration of one sleep-mode operation.\n# TYPE ${name} histogram\n`
      for (const [op, h] of this.operations)
        out += h.render(name, '', `operation="${op}"`).split('\n').slice(2).join('\n')
    }
    out += counter('vllm:num_preemptions_total', 'Cumulative number of preemption from the engine.', 0)
    out += counter('vllm:prompt_tokens_total', 'Number of prefill tokens processed.', this.promptTokens)
    out += counter(
      'vllm:generation_tokens_total',
      'Number of generation tokens processed.',
      this.generationTokens,
    )
    out += '# HELP vllm:request_success_total Count of successfully processed requests.\n'
    out += '# TYPE vllm:request_success_total counter\n'
    for (const reason of ['stop', 'length', 'abort']) {
      out += `vllm:request_success_total{${labels},finished_reason="${reason}"} ${num(this.finished[reason] ?? 0)}\n`
    }
    out += this.ttft.render(
      'vllm:time_to_first_token_seconds',
      'Histogram of time to first token in seconds.',
      labels,
    )
    out += this.e2e.render(
      'vllm:e2e_request_latency_seconds',
      'Histogram of e2e request latency in seconds.',
      labels,
    )
    return out
  }

  /** statsLine is vLLM's periodic `Engine 000: Avg prompt throughput …` line; undefined when idle. */
  statsLine(live: LiveFigures): string | undefined {
    const now = performance.now()
    const secs = Math.max(0.001, (now - this.lastAt) / 1000)
    const prompt = (this.promptTokens - this.lastPrompt) / secs
    const gen = (this.generationTokens - this.lastGeneration) / secs
    this.lastAt = now
    this.lastPrompt = this.promptTokens
    this.lastGeneration = this.generationTokens
    if (prompt === 0 && gen === 0 && live.running === 0 && live.waiting === 0) return undefined
    return (
      `Engine 000: Avg prompt throughput: ${prompt.toFixed(1)} tokens/s, Avg generation throughput: ${gen.toFixed(1)} tokens/s, ` +
      `Running: ${live.running} reqs, Waiting: ${live.waiting} reqs, GPU KV cache usage: ${(live.kvUsage * 100).toFixed(1)}%, ` +
      'Prefix cache hit rate: 0.0%'
    )
  }
}
