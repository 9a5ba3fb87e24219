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
  registerKvPoolMetrics(registry, service)
}

/**
 * KV pool gauges per GPU, from the kvcached segments of the shared-cache engines on it, summed at
 * scrape (SharedCache.usageByGpu, the figures the memory views use). Labelled by GPU index only, so
 * engines coming and going never add series. A GPU without shared-cache engines has no series.
 */
const KV_POOL_FIELDS = [
  ['used', 'usedBytes', 'KV cache memory in use in the shared pool of each GPU (sum of its engines)'],
  [
    'prealloc',
    'preallocBytes',
    'KV cache memory preallocated (mapped, not yet used) in the shared pool of each GPU',
  ],
  ['limit', 'totalBytes', "Sum of the KV limits (kvcached's total) of the shared-cache engines on each GPU"],
] as const

function registerKvPoolMetrics(registry: Registry, service: GatewayService): void {
  for (const [name, field, help] of KV_POOL_FIELDS) {
    new Gauge({
      name: `${METRIC_PREFIX}kv_pool_${name}_bytes`,
      help,
      labelNames: ['gpu'],
      registers: [registry],
      collect() {
        this.reset()
        for (const [gpu, u] of service.sharedCache.usageByGpu())
          this.set({ gpu: String(gpu) }, Math.round(u[field]))
      },
    })
  }
}
