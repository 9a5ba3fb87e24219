import { describe, expect, it } from 'bun:test'
import { type InstanceEvent, InstanceEvents } from '../../plugins/gateway/events.ts'

const ALL = new Set(['log', 'status', 'memory', 'progress', 'error'] as const)

describe('InstanceEvents', () => {
  it('replays the last N log lines and the latest of each other type, in emit order', () => {
    const events = new InstanceEvents('i1', 2)
    events.emit('status', { currentStatus: 'starting' })
    events.emit('log', { stream: 'stdout', content: 'a' })
    events.emit('progress', { percent: 10 })
    events.emit('log', { stream: 'stdout', content: 'b' })
    events.emit('progress', { percent: 50 })
    events.emit('log', { stream: 'stderr', content: 'c' })
    expect(events.recentLogs(10)).toEqual(['[stdout] b', '[stderr] c'])
    expect(events.logCount).toBe(2)
    const got: InstanceEvent[] = []
    events.subscribe(
      ALL,
      true,
      (e) => got.push(e),
      () => {},
    )
    expect(got.map((e) => e.id)).toEqual(['i1:1', 'i1:4', 'i1:5', 'i1:6'])
    const noLogs: InstanceEvent[] = []
    events.subscribe(
      ALL,
      false,
      (e) => noLogs.push(e),
      () => {},
    )
    expect(noLogs.map((e) => e.id)).toEqual(['i1:1', 'i1:5'])
  })

  it('filters by type, delivers live events and ends every subscription; a late one gets the replay and its end', () => {
    const events = new InstanceEvents('i2', 10)
    const got: string[] = []
    let ended = 0
    events.subscribe(
      new Set(['status'] as const),
      true,
      (e) => got.push(String(e.data.currentStatus)),
      () => ended++,
    )
    events.emit('log', { stream: 'stdout', content: 'x' })
    events.emit('status', { currentStatus: 'active' })
    events.emit('status', { currentStatus: 'removed' })
    events.end()
    expect(events.isEnded).toBe(true)
    expect(got).toEqual(['active', 'removed'])
    expect(ended).toBe(1)
    const late: string[] = []
    let lateEnded = 0
    events.subscribe(
      ALL,
      true,
      (e) => late.push(e.eventType),
      () => lateEnded++,
    )
    expect(late).toEqual(['log', 'status'])
    expect(lateEnded).toBe(1)
  })
})
