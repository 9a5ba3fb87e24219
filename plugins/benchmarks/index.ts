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
  // Its pages on the host's dashboard; a run's progress comes on the run's own stream.
  dashboard: {
    client: `${import.meta.dir}/dashboard/client.ts`,
    pages: [
      { id: 'benchmarks', title: 'Benchmarks', nav: 'Benchmarks', path: '/benchmarks' },
      { id: 'benchmark-compare', title: 'Two runs side by side', path: '/benchmarks/compare/:a/:b' },
      { id: 'benchmark', title: 'Benchmark run', path: '/benchmarks/:id' },
    ],
  },
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
