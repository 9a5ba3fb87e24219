import { Counter, Gauge, type Registry } from 'prom-client'
import { METRIC_PREFIX } from '../../host/metrics.ts'
import type { RefusalReason } from './grant.ts'

/**
 * KeyMetrics: requests, tokens and refusals by key name, with bounded cardinality: the first
 * MAX_NAMED key names seen get their own `key` label, every later one shares `other` (a host with
 * 100,000 keys must not make Prometheus hold 100,000 series per metric). Unknown keys are `unknown`.
 *
 * - `modelgate_key_requests_total{key,outcome}`: requests that reached a model (ok: status < 400);
 * - `modelgate_key_tokens_total{key,type}`: the engine's prompt and completion tokens;
 * - `modelgate_key_refusals_total{key,reason}`: requests, tokens (per minute), concurrency, quota,
 *   model, and invalid_key for a key nobody has;
 * - `modelgate_inference_keys`: live keys on this pod.
 *
 * Label children are made once per name and kept (no label hashing per request).
 */
export const MAX_NAMED = 100
const OTHER = 'other'

interface Series {
  label: string
  ok: Counter.Internal
  error: Counter.Internal
  prompt: Counter.Internal
  completion: Counter.Internal
  refusals: Map<string, Counter.Internal>
}

export class KeyMetrics {
  private readonly requests: Counter<'key' | 'outcome'>
  private readonly tokens: Counter<'key' | 'type'>
  private readonly refusals: Counter<'key' | 'reason'>
  private readonly series = new Map<string, Series>()

  constructor(registry: Registry, liveKeys: () => number) {
    this.requests = new Counter({
      name: `${METRIC_PREFIX}key_requests_total`,
      help: `Inference requests by key name (the first ${MAX_NAMED} names; later ones as "other") and outcome (ok: status below 400)`,
      labelNames: ['key', 'outcome'],
      registers: [registry],
    })
    this.tokens = new Counter({
      name: `${METRIC_PREFIX}key_tokens_total`,
      help: "Tokens by key name and type (prompt, completion), as the engine's usage counted them",
      labelNames: ['key', 'type'],
      registers: [registry],
    })
    this.refusals = new Counter({
      name: `${METRIC_PREFIX}key_refusals_total`,
      help: 'Inference requests refused for their key: requests or tokens per minute, concurrency, quota, model, invalid_key',
      labelNames: ['key', 'reason'],
      registers: [registry],
    })
    new Gauge({
      name: `${METRIC_PREFIX}inference_keys`,
      help: 'Live inference keys on this pod (the static INFERENCE_API_KEY not included)',
      registers: [registry],
      collect() {
        this.set(liveKeys())
      },
    })
  }

  ended(name: string, error: boolean, prompt: number, completion: number): void {
    const s = this.of(name)
    ;(error ? s.error : s.ok).inc()
    if (prompt > 0) s.prompt.inc(prompt)
    if (completion > 0) s.completion.inc(completion)
  }

  refused(name: string, reason: RefusalReason | 'invalid_key'): void {
    const s = this.of(name)
    let c = s.refusals.get(reason)
    if (!c) {
      c = this.refusals.labels(s.label, reason)
      s.refusals.set(reason, c)
    }
    c.inc()
  }

  private of(name: string): Series {
    let s = this.series.get(name)
    if (s) return s
    const label = this.series.size < MAX_NAMED || name === 'unknown' ? name : OTHER
    s = this.series.get(label)
    if (!s) {
      s = {
        label,
        ok: this.requests.labels(label, 'ok'),
        error: this.requests.labels(label, 'error'),
        prompt: this.tokens.labels(label, 'prompt'),
        completion: this.tokens.labels(label, 'completion'),
        refusals: new Map(),
      }
      this.series.set(label, s)
    }
    return s
  }
}
