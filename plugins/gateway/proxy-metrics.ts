import { Counter, Histogram, type Registry } from 'prom-client'
import { METRIC_PREFIX } from '../../src/host/metrics.ts'

/**
 * ProxyMetrics: the spec's request counter and latency histogram for proxied inference requests,
 * `modelgate_requests_total{model_id,status}` and `modelgate_request_duration_ms{model_id}`.
 * Buckets span LLM latencies from a cached 5 ms reply to a 10-minute generation. Label children are
 * cached so an observation is two increments, not a label-hashing lookup.
 */
export const DURATION_BUCKETS_MS = [
  5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000, 300000, 600000,
]

const REQUESTS = `${METRIC_PREFIX}requests_total`
const DURATION = `${METRIC_PREFIX}request_duration_ms`

type CounterChild = ReturnType<Counter<'model_id' | 'status'>['labels']>
type HistogramChild = ReturnType<Histogram<'model_id'>['labels']>

export class ProxyMetrics {
  private readonly requests: Counter<'model_id' | 'status'>
  private readonly duration: Histogram<'model_id'>
  private readonly counters = new Map<string, CounterChild>()
  private readonly histograms = new Map<string, HistogramChild>()

  constructor(registry: Registry) {
    // Registering twice on one registry (two proxies in one process) reuses the first metrics.
    this.requests =
      (registry.getSingleMetric(REQUESTS) as Counter<'model_id' | 'status'> | undefined) ??
      new Counter({
        name: REQUESTS,
        help: 'Proxied inference requests by model instance and outcome status (499: client went away)',
        labelNames: ['model_id', 'status'],
        registers: [registry],
      })
    this.duration =
      (registry.getSingleMetric(DURATION) as Histogram<'model_id'> | undefined) ??
      new Histogram({
        name: DURATION,
        help: 'Duration of proxied inference requests until their last byte, in milliseconds',
        labelNames: ['model_id'],
        buckets: DURATION_BUCKETS_MS,
        registers: [registry],
      })
  }

  observe(modelId: string, status: number, durationMs: number): void {
    const key = `${modelId}\u0000${status}`
    let counter = this.counters.get(key)
    if (!counter) {
      counter = this.requests.labels(modelId, String(status))
      this.counters.set(key, counter)
    }
    counter.inc()
    let histogram = this.histograms.get(modelId)
    if (!histogram) {
      histogram = this.duration.labels(modelId)
      this.histograms.set(modelId, histogram)
    }
    histogram.observe(durationMs)
  }
}
