import type { BenchmarkEvent } from './events.ts'
import type { Bundle, ImportResult } from './export.ts'
import type { BenchmarkRun } from './schemas.ts'

/** The bundle's format, which another pod's copy of it (the cluster's fleet) reads and checks. */
export { BUNDLE_FORMAT, BUNDLE_VERSION, type Bundle, BundleSchema } from './export.ts'

/**
 * BenchmarksApi is what other plugins (the cluster plugin) may call: the export/import bundle of
 * finished runs and read access to runs.
 */
export interface BenchmarksApi {
  get(id: string): BenchmarkRun | null
  /** existing: which of `ids` are runs on this pod (finished or not). */
  existing(ids: readonly string[]): string[]
  exportBundle(): Bundle
  importBundle(bundle: Bundle): ImportResult
}

/** Bus event: every benchmark stream event, for dashboards or the cluster relay. */
export interface BenchmarkBusEvent extends BenchmarkEvent {
  benchmark_id: string
}

declare module '../../src/host/bus.ts' {
  interface BusEvents {
    'benchmarks.event': BenchmarkBusEvent
  }
}
