import { Counter, Histogram, type Registry } from 'prom-client'
import type { EventBus } from '../../../src/host/bus.ts'
import { METRIC_PREFIX } from '../../../src/host/metrics.ts'

/**
 * ResidencyMetrics: what the residency manager does, for Prometheus:
 * `modelgate_residency_actions_total{model,action,reason}` (sleep1, sleep2, unload, cancel; why:
 * memory, sleep_unverified, abandoned, idle: the router's auto-sleep), `modelgate_cold_starts_total{model}` (loads from the
 * catalogue), and `modelgate_queue_wait_seconds{model}` (how long requests waited for their model:
 * every hold the model directory announces, by served name).
 */
const ACTIONS = `${METRIC_PREFIX}residency_actions_total`
const COLD = `${METRIC_PREFIX}cold_starts_total`
const QUEUE_WAIT = `${METRIC_PREFIX}queue_wait_seconds`
const WAIT_BUCKETS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600]

export class ResidencyMetrics {
  private readonly actions: Counter<'model' | 'action' | 'reason'>
  private readonly cold: Counter<'model'>

  constructor(registry: Registry, bus?: EventBus) {
    this.actions =
      (registry.getSingleMetric(ACTIONS) as Counter<'model' | 'action' | 'reason'> | undefined) ??
      new Counter({
        name: ACTIONS,
        help: 'What the residency manager did to make room or after a request left: by served model name, action and reason',
        labelNames: ['model', 'action', 'reason'],
        registers: [registry],
      })
    this.cold =
      (registry.getSingleMetric(COLD) as Counter<'model'> | undefined) ??
      new Counter({
        name: COLD,
        help: 'Models loaded from the catalogue (a cold start), by served model name',
        labelNames: ['model'],
        registers: [registry],
      })
    if (bus && !registry.getSingleMetric(QUEUE_WAIT)) {
      const wait = new Histogram({
        name: QUEUE_WAIT,
        help: 'Time inference requests waited for their model to load or wake, by served model name',
        labelNames: ['model'],
        buckets: WAIT_BUCKETS,
        registers: [registry],
      })
      bus.on('proxy.held', (e) => wait.observe({ model: e.model }, e.held_ms / 1000))
    }
  }

  action(model: string, action: string, reason: string): void {
    this.actions.inc({ model, action, reason })
  }

  coldStart(model: string): void {
    this.cold.inc({ model })
  }
}
