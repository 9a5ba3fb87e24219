import { Gauge, type Registry } from 'prom-client'
import { METRIC_PREFIX } from '../../src/host/metrics.ts'
import type { GatewayService } from './service.ts'

/**
 * registerGatewayMetrics: the spec's model gauges, derived at scrape time from the live instances
 * (no state kept twice). The request counter and histogram belong to the proxy.
 */
const STATUSES = ['active', 'starting', 'sleeping', 'stopping', 'failed'] as const

export function registerGatewayMetrics(registry: Registry, service: GatewayService): void {
  new Gauge({
    name: `${METRIC_PREFIX}models_total`,
    help: 'Model instances by status',
    labelNames: ['status'],
    registers: [registry],
    collect() {
      this.reset()
      const counts = new Map<string, number>(STATUSES.map((s) => [s, 0]))
      for (const i of service.instances.values()) counts.set(i.status, (counts.get(i.status) ?? 0) + 1)
      for (const [status, n] of counts) this.set({ status }, n)
    },
  })
  new Gauge({
    name: `${METRIC_PREFIX}gpu_memory_used_bytes`,
    help: 'GPU memory held by each model instance (all its GPUs), as last measured',
    labelNames: ['model_id'],
    registers: [registry],
    collect() {
      this.reset()
      for (const i of service.instances.values()) {
        const byGpu = i.currentMemoryGib
        if (!byGpu || i.status === 'failed') continue
        const gib = Object.values(byGpu).reduce((a, b) => a + b, 0)
        this.set({ model_id: i.id }, Math.round(gib * 2 ** 30))
      }
    },
  })
}
