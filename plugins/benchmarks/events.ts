import type { BenchmarkRun, Scenario } from './schemas.ts'

/**
 * Benchmark stream events. `scenario:failed`, `scenario:cancelled` and `benchmark:cancelled` exist
 * beside the completed and failed ones so every scenario and run ends with an event. Every payload carries `benchmark_id`; scenario events carry `scenario_id`.
 */
export type BenchmarkEventName =
  | 'benchmark:started'
  | 'scenario:started'
  | 'scenario:warmup'
  | 'scenario:progress'
  | 'scenario:completed'
  | 'scenario:failed'
  | 'scenario:cancelled'
  | 'benchmark:completed'
  | 'benchmark:failed'
  | 'benchmark:cancelled'

export interface BenchmarkEvent {
  event: BenchmarkEventName
  data: Record<string, unknown>
}

export const TERMINAL_EVENTS: ReadonlySet<BenchmarkEventName> = new Set([
  'benchmark:completed',
  'benchmark:failed',
  'benchmark:cancelled',
])

export const EVENT_DOCS = `Events (SSE event name → data):
- benchmark:started → {benchmark_id, name, mode, started_at, scenario_count}
- scenario:started → {benchmark_id, scenario_id, index, instance_id, model_name, routing_mode, started_at}
- scenario:warmup → {benchmark_id, scenario_id, completed, total}
- scenario:progress → {benchmark_id, scenario_id, completed, total, success_count, error_count}
- scenario:completed → {benchmark_id, scenario_id, status: "completed", metrics}
- scenario:failed → {benchmark_id, scenario_id, error, metrics?} (metrics when its requests ran and every one failed)
- scenario:cancelled → {benchmark_id, scenario_id, metrics?} (metrics of the requests that finished)
- benchmark:completed → {benchmark_id, status, completed_at, duration_seconds, total_requests, successful_requests, failed_requests}
- benchmark:failed → {benchmark_id, error, completed_at}
- benchmark:cancelled → {benchmark_id, error, completed_at}

A client that connects late first receives the current state as events (benchmark:started, then per started scenario scenario:started and its latest warmup/progress or its final event, then the run's final event). The stream closes after the run's final event.`

export const startedEvent = (run: BenchmarkRun): BenchmarkEvent => ({
  event: 'benchmark:started',
  data: {
    benchmark_id: run.id,
    name: run.name,
    mode: run.mode,
    started_at: run.started_at,
    scenario_count: run.scenarios.length,
  },
})

export const scenarioStartedEvent = (run: BenchmarkRun, s: Scenario): BenchmarkEvent => ({
  event: 'scenario:started',
  data: {
    benchmark_id: run.id,
    scenario_id: s.id,
    index: run.scenarios.indexOf(s),
    instance_id: s.instance_id,
    model_name: s.model_name,
    routing_mode: s.routing_mode,
    started_at: s.started_at,
  },
})

export const warmupEvent = (run: BenchmarkRun, s: Scenario): BenchmarkEvent => ({
  event: 'scenario:warmup',
  data: { benchmark_id: run.id, scenario_id: s.id, completed: s.warmup_completed, total: s.warmup_requests },
})

export const progressEvent = (run: BenchmarkRun, s: Scenario): BenchmarkEvent => ({
  event: 'scenario:progress',
  data: {
    benchmark_id: run.id,
    scenario_id: s.id,
    completed: s.completed_requests,
    total: s.total_requests,
    success_count: s.successful_requests,
    error_count: s.failed_requests,
  },
})

/** scenarioEndEvent is the final event of a finished scenario (null while it is not finished). */
export function scenarioEndEvent(run: BenchmarkRun, s: Scenario): BenchmarkEvent | null {
  const base = { benchmark_id: run.id, scenario_id: s.id }
  if (s.status === 'completed')
    return { event: 'scenario:completed', data: { ...base, status: 'completed', metrics: s.metrics } }
  if (s.status === 'failed') {
    const data = { ...base, error: s.error }
    return { event: 'scenario:failed', data: s.metrics ? { ...data, metrics: s.metrics } : data }
  }
  if (s.status === 'cancelled') {
    return { event: 'scenario:cancelled', data: s.metrics ? { ...base, metrics: s.metrics } : base }
  }
  return null
}

/** runEndEvent is the run's final event (null while it is pending or running). */
export function runEndEvent(run: BenchmarkRun): BenchmarkEvent | null {
  const at = { benchmark_id: run.id, completed_at: run.completed_at }
  if (run.status === 'completed') {
    return {
      event: 'benchmark:completed',
      data: {
        ...at,
        status: run.status,
        duration_seconds: run.duration_seconds,
        total_requests: run.total_requests,
        successful_requests: run.successful_requests,
        failed_requests: run.failed_requests,
      },
    }
  }
  if (run.status === 'failed') return { event: 'benchmark:failed', data: { ...at, error: run.error } }
  if (run.status === 'cancelled') return { event: 'benchmark:cancelled', data: { ...at, error: run.error } }
  return null
}

/** replay turns a run's current state into the events a late subscriber needs first. */
export function replay(run: BenchmarkRun): BenchmarkEvent[] {
  if (run.status === 'pending' || run.started_at === null) {
    const end = runEndEvent(run)
    return end ? [end] : []
  }
  const out: BenchmarkEvent[] = [startedEvent(run)]
  for (const s of run.scenarios) {
    if (s.started_at === null) {
      const end = scenarioEndEvent(run, s)
      if (end) out.push(end)
      continue
    }
    out.push(scenarioStartedEvent(run, s))
    if (s.warmup_completed > 0) out.push(warmupEvent(run, s))
    if (s.completed_requests > 0 || s.phase === 'measuring') out.push(progressEvent(run, s))
    const end = scenarioEndEvent(run, s)
    if (end) out.push(end)
  }
  const end = runEndEvent(run)
  if (end) out.push(end)
  return out
}
