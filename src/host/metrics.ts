import { collectDefaultMetrics, Registry } from 'prom-client'

/** METRIC_PREFIX: every metric of modelgate's own starts with it. */
export const METRIC_PREFIX = 'modelgate_'

/** createMetricsRegistry makes the one registry every plugin registers into. */
export function createMetricsRegistry(): Registry {
  const registry = new Registry()
  collectDefaultMetrics({ register: registry, prefix: METRIC_PREFIX })
  return registry
}
