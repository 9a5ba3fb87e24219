import { definePlugin } from '../../src/host/plugin.ts'
import type { BenchmarksApi } from './api.ts'
import { BenchmarksConfig } from './config.ts'
import init from './db/migrations/0001_init.sql' with { type: 'text' }
import { benchmarkRoutes } from './routes.ts'
import { BenchmarkService } from './service.ts'

/**
 * The benchmarks plugin: load runs against model instances (direct to the engine or through the
 * gateway proxy) measuring TTFT, throughput, latency percentiles and goodput the way
 * `vllm bench serve` does; runs are stored so they survive restarts.
 */
export default definePlugin<typeof BenchmarksConfig, BenchmarksApi>({
  id: 'benchmarks',
  description: 'Benchmark runs against model instances: TTFT, throughput, latency percentiles and goodput.',
  dependsOn: ['gateway'],
  config: BenchmarksConfig,
  migrations: [{ id: '0001_init', sql: init }],
  setup(ctx, cfg) {
    const service = new BenchmarkService(ctx, cfg)
    service.recover()
    return {
      routes: benchmarkRoutes(service),
      api: service.publicApi,
      start: () => service.start(),
      stop: (deadline) => service.stop(deadline),
    }
  },
})
