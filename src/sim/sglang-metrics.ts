import type { FinishReason } from './generation.ts'
import { E2E_BUCKETS, Histogram, type InferenceMetrics, num, TTFT_BUCKETS } from './metrics.ts'

/**
 * SglangMetrics keeps what an SGLang server exports on `/metrics` with `--enable-metrics`
 * (metrics/collector.py): the scheduler's gauges `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
 * `sglang:num_grammar_queue_reqs`, `sglang:num_paused_reqs`, `sglang:num_retracted_reqs`,
 * `sglang:token_usage` (the KV pool's share in use, 0–1), `sglang:num_used_tokens`,
 * `sglang:gen_throughput`, `sglang:cache_hit_rate`, and the tokenizer manager's counters and
 * histograms `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`,
 * `sglang:num_requests_total`, `sglang:time_to_first_token_seconds`,
 * `sglang:e2e_request_latency_seconds`; labels `model_name` (+ `engine_type`, `tp_rank`,
 * `pp_rank` on the scheduler's).
 */
export interface SglangLive {
  running: number
  queued: number
  /** requests held by a paused scheduler (`/pause_generation`): neither running nor queued */
  paused?: number
  usedTokens: number
  tokenUsage: number
}

export class SglangMetrics implements InferenceMetrics {
  promptTokens = 0
  generationTokens = 0
  requests = 0
  private readonly ttft = new Histogram(TTFT_BUCKETS)
  private readonly e2e = new Histogram(E2E_BUCKETS)

  constructor(private readonly modelName: string) {}

  firstToken(seconds: number, promptTokens: number): void {
    this.ttft.observe(seconds)
    this.promptTokens += promptTokens
  }

  finish(reason: FinishReason, seconds: number): void {
    this.requests++
    if (reason !== 'abort') this.e2e.observe(seconds)
  }

  render(live: SglangLive): string {
    const name = this.modelName.replaceAll('\\', '\\\\').replaceAll('"', '\\"')
    const tokenizer = `model_name="${name}"`
    const scheduler = `engine_type="unified",model_name="${name}",pp_rank="0",tp_rank="0"`
    const gauge = (metric: string, help: string, value: number) =>
      `# HELP ${metric} ${help}\n# TYPE ${metric} gauge\n${metric}{${scheduler}} ${num(value)}\n`
    const counter = (metric: string, help: string, value: number) =>
      `# HELP ${metric} ${help}\n# TYPE ${metric} counter\n${metric}{${tokenizer}} ${num(value)}\n`
    let out = ''
    out += gauge('sglang:num_running_reqs', 'The number of running requests.', live.running)
    out += gauge('sglang:num_used_tokens', 'The number of used tokens.', live.usedTokens)
    out += gauge('sglang:token_usage', 'The token usage.', live.tokenUsage)
    out += gauge('sglang:gen_throughput', 'The generation throughput (token/s).', 0)
    out += gauge('sglang:num_queue_reqs', 'The number of requests in the waiting queue.', live.queued)
    out += gauge('sglang:num_grammar_queue_reqs', 'The number of requests in the grammar waiting queue.', 0)
    out += gauge(
      'sglang:num_paused_reqs',
      'The number of paused requests by async weight sync.',
      live.paused ?? 0,
    )
    out += gauge('sglang:num_retracted_reqs', 'The number of retracted requests.', 0)
    out += gauge('sglang:cache_hit_rate', 'The prefix cache hit rate.', 0)
    out += counter('sglang:prompt_tokens_total', 'Number of prefill tokens processed.', this.promptTokens)
    out += counter(
      'sglang:generation_tokens_total',
      'Number of generation tokens processed.',
      this.generationTokens,
    )
    out += counter('sglang:num_requests_total', 'Number of requests processed.', this.requests)
    out += this.ttft.render(
      'sglang:time_to_first_token_seconds',
      'Histogram of time to first token in seconds.',
      tokenizer,
    )
    out += this.e2e.render(
      'sglang:e2e_request_latency_seconds',
      'Histogram of End-to-end request latency in seconds',
      tokenizer,
    )
    return out
  }
}
