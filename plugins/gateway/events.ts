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
interface Subscription {
  fn: Subscriber
  onEnd: () => void
}

export class InstanceEvents {
  private seq = 0
  private readonly logs: InstanceEvent[] = []
  private readonly latest = new Map<InstanceEventType, InstanceEvent>()
  private readonly subscribers = new Set<Subscription>()
  private ended = false

  constructor(
    readonly instanceId: string,
    private readonly maxLogLines: number,
  ) {}

  emit(eventType: InstanceEventType, data: Record<string, unknown>): InstanceEvent {
    const event: InstanceEvent = {
      id: `${this.instanceId}:${++this.seq}`,
      timestamp: new Date().toISOString(),
      instanceId: this.instanceId,
      eventType,
      data,
    }
    if (eventType === 'log') {
      this.logs.push(event)
      if (this.logs.length > this.maxLogLines) this.logs.splice(0, this.logs.length - this.maxLogLines)
    } else {
      this.latest.set(eventType, event)
    }
    for (const s of this.subscribers) s.fn(event)
    return event
  }

  /** recentLogs returns the last `n` buffered lines as `[stream] content`. */
  recentLogs(n: number): string[] {
    return this.logs.slice(-n).map((e) => `[${e.data.stream}] ${e.data.content}`)
  }

  get logCount(): number {
    return this.logs.length
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
    const replay: InstanceEvent[] = []
    if (replayLogs && types.has('log')) replay.push(...this.logs)
    for (const [type, e] of this.latest) if (types.has(type)) replay.push(e)
    replay.sort((a, b) => seqOf(a) - seqOf(b))
    for (const e of replay) fn(e)
    if (this.ended) {
      onEnd()
      return () => {}
    }
    const sub: Subscription = {
      fn: (e) => {
        if (types.has(e.eventType)) fn(e)
      },
      onEnd,
    }
    this.subscribers.add(sub)
    return () => this.subscribers.delete(sub)
  }

  /** end closes every live subscription (the instance is gone). */
  end(): void {
    this.ended = true
    const subs = [...this.subscribers]
    this.subscribers.clear()
    for (const s of subs) s.onEnd()
  }

  get isEnded(): boolean {
    return this.ended
  }
}

function seqOf(e: InstanceEvent): number {
  return Number(e.id.slice(e.id.lastIndexOf(':') + 1))
}
