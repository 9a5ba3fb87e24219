import { Elysia, t } from 'elysia'
import { ControllerError } from '../../../src/http/schemas.ts'
import { SAMPLE_INTERVAL_MS, SAMPLES_KEPT } from '../timeseries/ring.ts'
import type { TimeSeriesSampler } from '../timeseries/sampler.ts'

/** TimeSeriesBody: the time-series route's answer (the ring, oldest first). */
export const TimeSeriesBody = t.Object({
  interval_ms: t.Integer({ description: 'time between samples' }),
  t: t.Array(t.Number(), { description: 'when each sample was taken (Unix ms)' }),
  series: t.Record(t.String(), t.Array(t.Nullable(t.Number())), {
    description: 'values by series name, one per sample (null: no value then)',
  }),
})

/**
 * timeseriesRoutes: the gateway's last hour of figures, which its Metrics page draws (the live
 * stream sends the same ring, then each sample: events.ts).
 */
export function timeseriesRoutes(timeseries: TimeSeriesSampler) {
  const tags = ['gateway']
  return new Elysia({ name: 'gateway-timeseries' }).get(
    '/api/dashboard/timeseries',
    () => timeseries.ring.snapshot(),
    {
      response: { 200: TimeSeriesBody, 401: ControllerError },
      detail: {
        tags,
        summary:
          'The last hour of traffic, latency, tokens, KV-cache use and GPU memory (what the dashboard draws)',
        description:
          `One sample every ${SAMPLE_INTERVAL_MS / 1000} s, the last ${SAMPLES_KEPT} kept in memory (an hour; nothing ` +
          'survives a restart). Series: `requests_per_second`, `errors_per_second` (5xx), `ttft_p50_ms`, `ttft_p99_ms` ' +
          '(time to the first byte of the answer), `tokens_per_second` (output tokens, from the engines), ' +
          '`queued_p99_ms` (requests held for a wake), and per served model `kv_cache_usage/<model>` (0-1) and ' +
          '`gpu_memory_gib/<model>`. The event stream sends the same ring, then each new sample.',
        'x-required-role': 'admin-readonly',
      },
    },
  )
}
