import type { Metric, Registry } from 'prom-client'
import { METRIC_PREFIX } from '../../../src/host/metrics.ts'

/**
 * ProxyMetrics: the request counter and latency histogram for proxied inference requests,
 * `modelgate_requests_total{model_id,status}` and `modelgate_request_duration_ms{model_id}`.
 * Buckets span LLM latencies from a cached 5 ms reply to a 10-minute generation.
 *
 * An observation is on the proxy's hot path, so it is plain arithmetic on per-series tallies: no
 * label object, no label hashing, no allocation once a series exists (prom-client's own
 * observe/inc cost ~0.5 µs and a few objects per request). The tallies are turned into metric
 * values only when the registry is scraped, through two metric objects registered the way
 * prom-client's own are (`get()` returning name, help, type and values).
 */
export const DURATION_BUCKETS_MS = [
  5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000, 300000, 600000,
]

const REQUESTS = `${METRIC_PREFIX}requests_total`
const DURATION = `${METRIC_PREFIX}request_duration_ms`

/** ModelSeries: every series of one model instance. */
interface ModelSeries {
  modelId: string
  /** Requests by status. */
  statuses: Map<number, number>
  /** Observations per bucket (not cumulative); the last slot counts those above every bound. */
  buckets: Float64Array
  sum: number
  count: number
}

type MetricValue = { labels: Record<string, string | number>; value: number; metricName?: string }

/** Tallies: the series of one registry, shared by every ProxyMetrics registered on it. */
class Tallies {
  readonly models = new Map<string, ModelSeries>()

  readonly requestsMetric = this.exposed(
    REQUESTS,
    'Proxied inference requests by model instance and outcome status (499: client went away)',
    'counter',
    (m) =>
      [...m.statuses].map(([status, count]) => ({
        labels: { model_id: m.modelId, status: String(status) },
        value: count,
      })),
  )

  readonly durationMetric = this.exposed(
    DURATION,
    'Duration of proxied inference requests until their last byte, in milliseconds',
    'histogram',
    histogramValues,
  )

  /** exposed: a metric object as prom-client's registry reads them, its values derived at scrape. */
  private exposed(
    name: string,
    help: string,
    type: 'counter' | 'histogram',
    valuesOf: (m: ModelSeries) => MetricValue[],
  ) {
    const metric = { name, help, type, aggregator: 'sum' }
    return {
      ...metric,
      get: async () => ({ ...metric, values: [...this.models.values()].flatMap(valuesOf) }),
      reset: () => this.models.clear(),
      tallies: this,
    }
  }
}

/** histogramValues: one series in Prometheus' histogram form (cumulative buckets, +Inf, sum, count). */
function histogramValues(s: ModelSeries): MetricValue[] {
  const out: MetricValue[] = []
  let cumulative = 0
  DURATION_BUCKETS_MS.forEach((le, i) => {
    cumulative += s.buckets[i]!
    out.push({ labels: { le, model_id: s.modelId }, value: cumulative, metricName: `${DURATION}_bucket` })
  })
  out.push({ labels: { le: '+Inf', model_id: s.modelId }, value: s.count, metricName: `${DURATION}_bucket` })
  out.push({ labels: { model_id: s.modelId }, value: s.sum, metricName: `${DURATION}_sum` })
  out.push({ labels: { model_id: s.modelId }, value: s.count, metricName: `${DURATION}_count` })
  return out
}

export class ProxyMetrics {
  private readonly tallies: Tallies

  constructor(registry: Registry) {
    // Registering twice on one registry (two proxies in one process) shares the first tallies.
    const existing = registry.getSingleMetric(REQUESTS) as unknown as { tallies?: Tallies } | undefined
    if (existing?.tallies) this.tallies = existing.tallies
    else {
      this.tallies = new Tallies()
      // prom-client's registry reads any object with its metrics' shape; the types only name its classes.
      registry.registerMetric(this.tallies.requestsMetric as unknown as Metric)
      registry.registerMetric(this.tallies.durationMetric as unknown as Metric)
    }
  }

  observe(modelId: string, status: number, durationMs: number): void {
    let m = this.tallies.models.get(modelId)
    if (!m) {
      m = {
        modelId,
        statuses: new Map(),
        buckets: new Float64Array(DURATION_BUCKETS_MS.length + 1),
        sum: 0,
        count: 0,
      }
      this.tallies.models.set(modelId, m)
    }
    m.statuses.set(status, (m.statuses.get(status) ?? 0) + 1)
    let i = 0
    while (i < DURATION_BUCKETS_MS.length && durationMs > DURATION_BUCKETS_MS[i]!) i++
    m.buckets[i]!++
    m.sum += durationMs
    m.count++
  }
}
