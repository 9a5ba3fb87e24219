import { ReplayHub } from '../../src/host/hub.ts'

/**
 * InstanceEvents is the per-instance event stream behind
 * GET /api/v1/models/instances/{id}/events: a bounded ring of recent log lines (replayed on connect
 * when replay_logs is true), the latest status/progress/memory events (sent first to a late
 * subscriber so it sees the current state), and live fan-out to subscribers.
 */
export type InstanceEventType = 'log' | 'status' | 'memory' | 'progress' | 'error'
export const INSTANCE_EVENT_TYPES: readonly InstanceEventType[] = [
  'log',
  'status',
  'memory',
  'progress',
  'error',
]

export interface InstanceEvent {
  id: string
  timestamp: string
  instanceId: string
  eventType: InstanceEventType
  data: Record<string, unknown>
}

type Subscriber = (e: InstanceEvent) => void

export class InstanceEvents {
  private seq = 0
  private readonly hub: ReplayHub<InstanceEvent>

  constructor(
    readonly instanceId: string,
    maxLogLines: number,
  ) {
    this.hub = new ReplayHub({
      keep: (e) => e.eventType,
      limit: (type) => (type === 'log' ? maxLogLines : 1),
    })
  }

  emit(eventType: InstanceEventType, data: Record<string, unknown>): InstanceEvent {
    const event: InstanceEvent = {
      id: `${this.instanceId}:${++this.seq}`,
      timestamp: new Date().toISOString(),
      instanceId: this.instanceId,
      eventType,
      data,
    }
    this.hub.publish(event)
    return event
  }

  /** recentLogs returns the last `n` buffered lines as `[stream] content`. */
  recentLogs(n: number): string[] {
    return this.hub
      .kept('log')
      .slice(-n)
      .map((e) => `[${e.data.stream}] ${e.data.content}`)
  }

  get logCount(): number {
    return this.hub.kept('log').length
  }

  /**
   * subscribe sends the replay (buffered logs if asked, then the latest state events, in id order)
   * and then live events. Returns the unsubscribe function.
   */
  subscribe(
    types: ReadonlySet<InstanceEventType>,
    replayLogs: boolean,
    fn: Subscriber,
    onEnd: () => void,
  ): () => void {
    return this.hub.subscribe(fn, {
      filter: (e) => types.has(e.eventType),
      replay: replayLogs || ((e) => e.eventType !== 'log'),
      onEnd,
    })
  }

  /** end closes every live subscription (the instance is gone). */
  end(): void {
    this.hub.end()
  }

  get isEnded(): boolean {
    return this.hub.ended
  }
}
