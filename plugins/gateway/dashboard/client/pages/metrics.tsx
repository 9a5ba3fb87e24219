import { colorOf, type Line, TimeChart } from '../../../../../src/dashboard/client/components/time-chart.tsx'
import { timeseries } from '../live.ts'

/**
 * MetricsPage: the last hour without a Prometheus, from the gateway's in-memory ring
 * (`/api/dashboard/timeseries`, then one sample every 5 s on the event stream): traffic and errors,
 * TTFT, tokens per second, time held for a wake, and per served model its KV-cache use and GPU
 * memory. For longer history and alerts, point Prometheus at `/metrics` (README, Observability).
 */
function perModel(prefix: string, names: string[]): Line[] {
  return names
    .filter((n) => n.startsWith(`${prefix}/`))
    .sort()
    .map((n, i) => ({ series: n, label: n.slice(prefix.length + 1), color: colorOf(i) }))
}

export function MetricsPage() {
  const ts = timeseries.value
  if (!ts) return <p class="muted">Reading the time series…</p>
  const names = Object.keys(ts.series)
  const seconds = Math.round((ts.t.length * ts.interval_ms) / 1000)
  const span = seconds < 120 ? `${seconds} s` : `${Math.round(seconds / 60)} min`
  return (
    <div class="page">
      <p class="muted">
        The last {span}, one sample every {ts.interval_ms / 1000} s (kept in memory for an hour).
      </p>
      <div class="time-charts">
        <TimeChart
          id="chart-requests"
          title="Requests per second"
          unit="req/s"
          ts={ts}
          lines={[
            { series: 'requests_per_second', label: 'requests', color: colorOf(0) },
            { series: 'errors_per_second', label: 'errors (5xx)', color: colorOf(1) },
          ]}
        />
        <TimeChart
          id="chart-ttft"
          title="Time to first token"
          unit="ms"
          ts={ts}
          lines={[
            { series: 'ttft_p50_ms', label: 'p50', color: colorOf(0) },
            { series: 'ttft_p99_ms', label: 'p99', color: colorOf(1) },
          ]}
        />
        <TimeChart
          id="chart-tokens"
          title="Output tokens per second"
          unit="tok/s"
          ts={ts}
          lines={[{ series: 'tokens_per_second', label: 'tokens', color: colorOf(2) }]}
        />
        <TimeChart
          id="chart-queued"
          title="Time held for a wake (p99)"
          unit="ms"
          ts={ts}
          lines={[{ series: 'queued_p99_ms', label: 'p99', color: colorOf(3) }]}
        />
        <TimeChart
          id="chart-kv"
          title="KV-cache use"
          unit="0–1"
          ts={ts}
          lines={perModel('kv_cache_usage', names)}
        />
        <TimeChart
          id="chart-gpu"
          title="GPU memory by model"
          unit="GiB"
          ts={ts}
          lines={perModel('gpu_memory_gib', names)}
        />
      </div>
    </div>
  )
}
