import { describe, expect, test } from 'bun:test'
import { Registry } from 'prom-client'
import { DURATION_BUCKETS_MS, ProxyMetrics } from '../../plugins/gateway/proxy/metrics.ts'

/** series: the exposition lines of one metric name prefix, as a map from line head to value. */
async function series(registry: Registry, prefix: string): Promise<Map<string, number>> {
  const out = new Map<string, number>()
  for (const line of (await registry.metrics()).split('\n')) {
    if (!line.startsWith(prefix)) continue
    const space = line.lastIndexOf(' ')
    out.set(line.slice(0, space), Number(line.slice(space + 1)))
  }
  return out
}

describe('proxy metrics (tallied per request, exposed at scrape)', () => {
  test('requests_total counts by instance and status', async () => {
    const registry = new Registry()
    const m = new ProxyMetrics(registry)
    m.observe('a', 200, 3)
    m.observe('a', 200, 4)
    m.observe('a', 499, 4)
    m.observe('b', 503, 1)
    const s = await series(registry, 'modelgate_requests_total')
    expect(s).toEqual(
      new Map([
        ['modelgate_requests_total{model_id="a",status="200"}', 2],
        ['modelgate_requests_total{model_id="a",status="499"}', 1],
        ['modelgate_requests_total{model_id="b",status="503"}', 1],
      ]),
    )
    expect(await registry.metrics()).toMatch(/^# TYPE modelgate_requests_total counter$/m)
  })

  test('duration histogram: cumulative buckets, a value on a bound counts in it, +Inf, sum, count', async () => {
    const registry = new Registry()
    const m = new ProxyMetrics(registry)
    for (const ms of [5, 5.01, 250, 600_000, 700_000]) m.observe('a', 200, ms)
    const s = await series(registry, 'modelgate_request_duration_ms')
    const bucket = (le: string | number) =>
      s.get(`modelgate_request_duration_ms_bucket{le="${le}",model_id="a"}`)
    expect(bucket(5)).toBe(1)
    expect(bucket(10)).toBe(2)
    expect(bucket(100)).toBe(2)
    expect(bucket(250)).toBe(3)
    expect(bucket(600000)).toBe(4)
    expect(bucket('+Inf')).toBe(5)
    expect(s.get('modelgate_request_duration_ms_sum{model_id="a"}')).toBeCloseTo(1_300_260.01, 5)
    expect(s.get('modelgate_request_duration_ms_count{model_id="a"}')).toBe(5)
    // every bound, then +Inf, sum and count
    expect(s.size).toBe(DURATION_BUCKETS_MS.length + 3)
    expect(await registry.metrics()).toMatch(/^# TYPE modelgate_request_duration_ms histogram$/m)
  })

  test('two proxies on one registry share the series; reset clears them', async () => {
    const registry = new Registry()
    new ProxyMetrics(registry).observe('a', 200, 1)
    new ProxyMetrics(registry).observe('a', 200, 1)
    expect(
      (await series(registry, 'modelgate_requests_total')).get(
        'modelgate_requests_total{model_id="a",status="200"}',
      ),
    ).toBe(2)
    registry.resetMetrics()
    expect((await series(registry, 'modelgate_requests_total')).size).toBe(0)
    const json = await registry.getMetricsAsJSON()
    expect(json.map((x) => x.name).sort()).toEqual([
      'modelgate_request_duration_ms',
      'modelgate_requests_total',
    ])
  })
})
