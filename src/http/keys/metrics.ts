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
 * A request moves plain numbers; the metrics read them when scraped (no label hashing per request).
 */
export const MAX_NAMED = 100
const OTHER = 'other'

/** Series: one label's tallies, plain numbers moved per request (metric values only at scrape). */
interface Series {
  label: string
  ok: number
  error: number
  prompt: number
  completion: number
  refusals: Map<string, number>
}

export class KeyMetrics {
  private readonly series = new Map<string, Series>()

  constructor(registry: Registry, liveKeys: () => number) {
    const series = this.series
    new Counter({
      name: `${METRIC_PREFIX}key_requests_total`,
      help: `Inference requests by key name (the first ${MAX_NAMED} names; later ones as "other") and outcome (ok: status below 400)`,
      labelNames: ['key', 'outcome'],
      registers: [registry],
      collect() {
        this.reset()
        for (const s of series.values()) {
          if (s.ok > 0) this.inc({ key: s.label, outcome: 'ok' }, s.ok)
          if (s.error > 0) this.inc({ key: s.label, outcome: 'error' }, s.error)
        }
      },
    })
    new Counter({
      name: `${METRIC_PREFIX}key_tokens_total`,
      help: "Tokens by key name and type (prompt, completion), as the engine's usage counted them",
      labelNames: ['key', 'type'],
      registers: [registry],
      collect() {
        this.reset()
        for (const s of series.values()) {
          if (s.prompt > 0) this.inc({ key: s.label, type: 'prompt' }, s.prompt)
          if (s.completion > 0) this.inc({ key: s.label, type: 'completion' }, s.completion)
        }
      },
    })
    new Counter({
      name: `${METRIC_PREFIX}key_refusals_total`,
      help: 'Inference requests refused for their key: requests or tokens per minute, concurrency, quota, model, invalid_key',
      labelNames: ['key', 'reason'],
      registers: [registry],
      collect() {
        this.reset()
        for (const s of series.values())
          for (const [reason, n] of s.refusals) this.inc({ key: s.label, reason }, n)
      },
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
    if (error) s.error++
    else s.ok++
    s.prompt += prompt
    s.completion += completion
  }

  refused(name: string, reason: RefusalReason | 'invalid_key'): void {
    const s = this.of(name)
    s.refusals.set(reason, (s.refusals.get(reason) ?? 0) + 1)
  }

  private of(name: string): Series {
    let s = this.series.get(name)
    if (s) return s
    const label = this.series.size < MAX_NAMED || name === 'unknown' ? name : OTHER
    s = this.series.get(label)
    if (!s) {
      s = { label, ok: 0, error: 0, prompt: 0, completion: 0, refusals: new Map() }
      this.series.set(label, s)
    }
    return s
  }
}
