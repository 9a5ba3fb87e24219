import { type Static, Type as T } from '@sinclair/typebox'

/** BenchmarksConfig is `plugins.benchmarks` in the YAML. */
export const BenchmarksConfig = T.Object(
  {
    max_concurrent_runs: T.Integer({
      default: 1,
      minimum: 1,
      maximum: 16,
      description:
        'runs executing at once; later runs wait as pending (one at a time keeps runs from skewing each other)',
    }),
    max_queued_runs: T.Integer({
      default: 32,
      minimum: 0,
      maximum: 1000,
      description: 'pending runs allowed to wait for a slot; creating more answers 409 BENCHMARK_QUEUE_FULL',
    }),
    request_timeout_ms: T.Integer({
      default: 600_000,
      minimum: 100,
      description: 'deadline of one benchmark request; a request past it is aborted and counted as failed',
    }),
    tokenize_timeout_ms: T.Integer({
      default: 30_000,
      minimum: 100,
      description: 'deadline of one /tokenize call',
    }),
    progress_interval_ms: T.Integer({
      default: 250,
      minimum: 0,
      maximum: 60_000,
      description:
        'least gap between scenario:warmup / scenario:progress events of a scenario (the last is always sent)',
    }),
  },
  { additionalProperties: false },
)

export type BenchmarksConfig = Static<typeof BenchmarksConfig>
