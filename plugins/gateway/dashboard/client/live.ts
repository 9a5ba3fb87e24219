import { batch, computed, signal } from '@preact/signals'
import { onLive } from '../../../../src/dashboard/client/live.ts'
import { type ApiError, api } from './api.ts'
import type {
  DashboardEventMap,
  DashboardEventName,
  GpuAvailable,
  InstanceRecord,
  MoveEvent,
  MultiGpu,
  TimeSeries,
} from './types.ts'

/**
 * What every gateway page shows, kept current by the gateway's events on the dashboard's one live
 * stream (`/api/dashboard/events`, the host's; the gateway's feed: ../events.ts): the instances (full records), their load and wake progress, the
 * operation each is running, the moves, and the GPU and memory views. The views are refetched when
 * an event says they changed (a state change, an operation ending, requests ending), never on a timer.
 */
export type Progress = DashboardEventMap['progress']

export const instances = signal<ReadonlyMap<string, InstanceRecord>>(new Map())
export const progress = signal<ReadonlyMap<string, Progress>>(new Map())
export const operations = signal<ReadonlyMap<string, string>>(new Map())
export const moves = signal<ReadonlyMap<string, MoveEvent>>(new Map())
export const memory = signal<MultiGpu | null>(null)
export const gpus = signal<GpuAvailable | null>(null)
export const viewsError = signal<ApiError | null>(null)
/**
 * timeseries: the last hour of the gateway's time series (the ring the stream sends first, then each
 * sample appended); kept to the ring's own length, so the page's memory is bounded as the server's.
 */
export const timeseries = signal<TimeSeries | null>(null)
/**
 * catalogChanges / residencyChanges count the catalogue's changes and the residency manager's
 * decisions seen on the stream: a page that shows either refetches it when its count moves.
 */
export const catalogChanges = signal(0)
export const residencyChanges = signal(0)

/** colors: each instance's colour from the memory view (a colour hashed from the instance, the same on every page). */
export const colors = computed(() => {
  const out = new Map<string, string>()
  for (const g of memory.value?.gpus ?? []) for (const m of g.models) out.set(m.instance_id, m.color)
  return out
})

/** sortedInstances: oldest first, as the memory views order them. */
export const sortedInstances = computed(() =>
  [...instances.value.values()].sort(
    (a, b) => a.loaded_at.localeCompare(b.loaded_at) || a.id.localeCompare(b.id),
  ),
)

let fetching: Promise<void> | null = null
let again = false

/** refreshViews refetches the GPU and memory views; calls while one runs collapse into one more. */
export function refreshViews(): Promise<void> {
  if (fetching) {
    again = true
    return fetching
  }
  fetching = (async () => {
    do {
      again = false
      try {
        const [m, g] = await Promise.all([api.memory(), api.gpus()])
        batch(() => {
          memory.value = m
          gpus.value = g
          viewsError.value = null
        })
      } catch (err) {
        viewsError.value = err as ApiError
      }
    } while (again)
    fetching = null
  })()
  return fetching
}

function withEntry<V>(map: ReadonlyMap<string, V>, key: string, value: V | undefined): Map<string, V> {
  const next = new Map(map)
  if (value === undefined) next.delete(key)
  else next.set(key, value)
  return next
}

type Handlers = { [K in DashboardEventName]: (data: DashboardEventMap[K]) => void }

const handlers: Handlers = {
  instances: ({ instances: list }) => {
    instances.value = new Map(list.map((i) => [i.id, i]))
    void refreshViews()
  },
  instance: (e) => {
    instances.value = withEntry(
      instances.value,
      e.instance.id,
      e.currentStatus === 'removed' ? undefined : e.instance,
    )
    if (e.currentStatus === 'removed') progress.value = withEntry(progress.value, e.instance.id, undefined)
    void refreshViews()
  },
  progress: (e) => {
    progress.value = withEntry(progress.value, e.instance_id, e)
  },
  operation: (e) => {
    operations.value = withEntry(operations.value, e.instance_id, e.running ? e.operation : undefined)
    if (!e.running) void refreshViews()
  },
  move: (e) => {
    moves.value = withEntry(moves.value, e.move_id, e)
  },
  traffic: () => void refreshViews(),
  catalog: () => {
    catalogChanges.value++
  },
  residency: () => {
    residencyChanges.value++
  },
  timeseries: (ts) => {
    timeseries.value = ts
  },
  sample: (s) => {
    const ts = timeseries.value
    if (!ts) return
    const keep = Math.max(1, Math.round(3_600_000 / ts.interval_ms))
    const drop = Math.max(0, ts.t.length + 1 - keep)
    const t = [...ts.t.slice(drop), s.t]
    const series: TimeSeries['series'] = {}
    for (const name of new Set([...Object.keys(ts.series), ...Object.keys(s.values)])) {
      const old = ts.series[name] ?? ts.t.map(() => null)
      series[name] = [...old.slice(drop), s.values[name] ?? null]
    }
    timeseries.value = { interval_ms: ts.interval_ms, t, series }
  },
}

for (const [name, handle] of Object.entries(handlers)) onLive(name, handle as (d: unknown) => void)
