import type { LiveFeed, LiveSend } from '../../../src/dashboard/contract.ts'
import type { EventBus } from '../../../src/host/bus.ts'
import type { CatalogChange, InstanceRecord, InstanceStatus, MoveEvent } from '../api.ts'
import type { InstanceEvents } from '../events.ts'
import type { Operation } from '../lifecycle.ts'
import type { ResidencyDecision } from '../residency/manager.ts'
import type { TimeSample, TimeSeries } from '../timeseries/ring.ts'
import type { TimeSeriesSampler } from '../timeseries/sampler.ts'

/**
 * The gateway's feed of the dashboard's one live stream (`GET /api/dashboard/events`, the host's):
 * it relays the gateway's bus events and every instance's progress events; the page refetches the
 * GPU and memory views when one arrives. Its first event is the instance list, so a client that
 * connects (or reconnects) starts from the current state.
 */
export interface DashboardEventMap {
  /** The current instances (full records), first on every connection. */
  instances: { instances: InstanceRecord[] }
  /** An instance changed state (`removed`: it is gone); the record as it is now. */
  instance: {
    instance: InstanceRecord
    previousStatus: InstanceStatus | null
    currentStatus: InstanceStatus | 'removed'
    message: string
  }
  /** A load's or a wake's progress, from the instance's own event stream. */
  progress: { instance_id: string; phase: string; percent: number; message: string }
  /** An operation (sleep, wake, move) began (`running`) or ended on an instance. */
  operation: { instance_id: string; operation: Operation; running: boolean }
  /** A blue-green move's progress (as `move_progress` on the move's own stream). */
  move: MoveEvent
  /** Proxied requests ended since the last `traffic` event (KV-cache use moves with them). */
  traffic: { requests: number }
  /** The last hour of the time series (the ring, oldest first), second on every connection. */
  timeseries: TimeSeries
  /** One new sample of every series, every 5 s. */
  sample: TimeSample
  /** A catalogue entry saved or removed through the API (`gateway.catalog.changed`). */
  catalog: CatalogChange
  /** The residency manager slept or unloaded models to make room (`gateway.residency.decision`). */
  residency: ResidencyDecision
}

export type DashboardEventName = keyof DashboardEventMap

/** What the stream reads from the gateway: its instances and their per-instance events. */
export interface DashboardSource {
  bus: EventBus
  list(): InstanceRecord[]
  events(id: string): InstanceEvents | undefined
  timeseries: TimeSeriesSampler
}

/** TRAFFIC_EVERY_MS: proxied requests are summed into one `traffic` event at most this often. */
export const TRAFFIC_EVERY_MS = 2000

/** gatewayFeed: the gateway's part of each live connection. */
export function gatewayFeed(src: DashboardSource): LiveFeed {
  return (live) => relay(src, live)
}

function relay(src: DashboardSource, live: LiveSend): () => void {
  const send = <K extends DashboardEventName>(name: K, data: DashboardEventMap[K]) => live(name, data)
  const following = new Map<string, () => void>()
  /** follow relays an instance's progress events (the latest one first) until the instance is removed. */
  const follow = (id: string) => {
    const events = src.events(id)
    if (following.has(id) || !events || events.isEnded) return
    const stop = events.subscribe(
      new Set(['progress'] as const),
      false,
      (e) =>
        send('progress', {
          instance_id: id,
          phase: String(e.data.phase ?? ''),
          percent: Number(e.data.percent ?? 0),
          message: String(e.data.message ?? ''),
        }),
      () => following.delete(id),
    )
    if (!events.isEnded) following.set(id, stop)
  }
  let requests = 0
  let trafficTimer: ReturnType<typeof setTimeout> | undefined
  const offs = [
    src.bus.on('gateway.instance.status', (e) => {
      send('instance', {
        instance: e.instance,
        previousStatus: e.previousStatus,
        currentStatus: e.currentStatus,
        message: e.message,
      })
      if (e.currentStatus !== 'removed') follow(e.instance.id)
    }),
    src.bus.on('gateway.instance.lifecycle', (e) => {
      if (e.change.kind === 'operation')
        send('operation', {
          instance_id: e.instance_id,
          operation: e.change.operation,
          running: e.change.running,
        })
    }),
    src.bus.on('gateway.move.progress', (e) => send('move', e)),
    src.bus.on('gateway.catalog.changed', (c) => send('catalog', c)),
    src.bus.on('gateway.residency.decision', (d) => send('residency', d)),
    src.bus.on('proxy.request', () => {
      requests++
      trafficTimer ??= setTimeout(() => {
        trafficTimer = undefined
        send('traffic', { requests })
        requests = 0
      }, TRAFFIC_EVERY_MS)
    }),
  ]
  const instances = src.list()
  send('instances', { instances })
  for (const i of instances) follow(i.id)
  send('timeseries', src.timeseries.ring.snapshot())
  offs.push(src.timeseries.samples.subscribe((s) => send('sample', s)))
  return () => {
    for (const off of offs) off()
    for (const stop of following.values()) stop()
    following.clear()
    clearTimeout(trafficTimer)
  }
}
