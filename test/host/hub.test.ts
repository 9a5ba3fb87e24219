import { describe, expect, it } from 'bun:test'
import { EventBus } from '../../src/host/bus.ts'
import { ReplayHub } from '../../src/host/hub.ts'
import { sseResponse } from '../../src/http/sse.ts'
import { readSse } from '../support/sse.ts'

interface Ev {
  kind: string
  n: number
}

const ev = (kind: string, n: number): Ev => ({ kind, n })
const collect = (hub: ReplayHub<Ev>, opts: Parameters<ReplayHub<Ev>['subscribe']>[1] = {}) => {
  const got: Ev[] = []
  const ends = { count: 0 }
  const off = hub.subscribe((e) => got.push(e), { ...opts, onEnd: () => ends.count++ })
  return { got, ends, off }
}

describe('ReplayHub', () => {
  it('keeps each slot to its limit, oldest dropped first, and replays the slots in publish order', () => {
    const hub = new ReplayHub<Ev>({ keep: (e) => e.kind, limit: (slot) => (slot === 'log' ? 3 : 1) })
    hub.publish(ev('status', 1))
    for (let n = 2; n <= 6; n++) hub.publish(ev('log', n))
    hub.publish(ev('progress', 7))
    hub.publish(ev('log', 8))
    hub.publish(ev('status', 9))
    expect(hub.kept('log').map((e) => e.n)).toEqual([5, 6, 8])
    expect(hub.kept('status').map((e) => e.n)).toEqual([9])
    expect(hub.kept().map((e) => e.n)).toEqual([5, 6, 7, 8, 9])
    expect(collect(hub).got.map((e) => e.n)).toEqual([5, 6, 7, 8, 9])
  })

  it('keeps nothing without `keep`: a late subscriber gets live events only', () => {
    const hub = new ReplayHub<Ev>()
    hub.publish(ev('a', 1))
    const { got } = collect(hub)
    hub.publish(ev('a', 2))
    expect(got.map((e) => e.n)).toEqual([2])
    expect(hub.kept()).toEqual([])
  })

  it('a late subscriber gets the replay, then live events, in order; filter and replay predicate apply', () => {
    const hub = new ReplayHub<Ev>({ keep: (e) => e.kind, limit: 10 })
    hub.publish(ev('log', 1))
    hub.publish(ev('status', 2))
    hub.publish(ev('log', 3))
    const all = collect(hub)
    const noLogReplay = collect(hub, { replay: (e) => e.kind !== 'log' })
    const statusOnly = collect(hub, { filter: (e) => e.kind === 'status' })
    const liveOnly = collect(hub, { replay: false })
    hub.publish(ev('log', 4))
    hub.publish(ev('status', 5))
    expect(all.got.map((e) => e.n)).toEqual([1, 2, 3, 4, 5])
    expect(noLogReplay.got.map((e) => e.n)).toEqual([2, 4, 5])
    expect(statusOnly.got.map((e) => e.n)).toEqual([2, 5])
    expect(liveOnly.got.map((e) => e.n)).toEqual([4, 5])
  })

  it('replays the owner state from `snapshot` instead of kept events', () => {
    let state: Ev[] = [ev('started', 1)]
    const hub = new ReplayHub<Ev>({ snapshot: () => state })
    state = [ev('started', 1), ev('progress', 2)]
    const { got } = collect(hub)
    hub.publish(ev('progress', 3))
    expect(got.map((e) => e.n)).toEqual([1, 2, 3])
  })

  it('end() completes every consumer once, after the events published before it', () => {
    const hub = new ReplayHub<Ev>({ keep: () => 'state' })
    const a = collect(hub)
    const order: string[] = []
    hub.subscribe((e) => order.push(`event ${e.n}`), { onEnd: () => order.push('end') })
    hub.publish(ev('phase', 1))
    hub.end()
    hub.end()
    hub.publish(ev('phase', 2))
    expect(hub.ended).toBe(true)
    expect(a.got.map((e) => e.n)).toEqual([1])
    expect(a.ends.count).toBe(1)
    expect(order).toEqual(['event 1', 'end'])
    expect(hub.subscriberCount).toBe(0)
    a.off()
    // A subscriber after the end gets the replay (the final state) and its end at once.
    const late = collect(hub)
    expect(late.got.map((e) => e.n)).toEqual([2])
    expect(late.ends.count).toBe(1)
    expect(hub.subscriberCount).toBe(0)
  })

  it('an end() from inside a listener comes after the events already queued', () => {
    const hub = new ReplayHub<Ev>()
    const seen: string[] = []
    hub.subscribe((e) => {
      if (e.n === 1) {
        hub.publish(ev('x', 2))
        hub.end()
      }
    })
    hub.subscribe((e) => seen.push(`event ${e.n}`), { onEnd: () => seen.push('end') })
    hub.publish(ev('x', 1))
    expect(seen).toEqual(['event 1', 'event 2', 'end'])
  })

  it('a listener removed during a dispatch gets nothing more, not even the rest of that dispatch', () => {
    const hub = new ReplayHub<Ev>()
    const got: number[] = []
    let offB = () => {}
    const offA = hub.subscribe((e) => {
      got.push(e.n)
      offB()
      offA()
    })
    offB = hub.subscribe((e) => got.push(-e.n))
    const c = collect(hub)
    hub.publish(ev('x', 1))
    hub.publish(ev('x', 2))
    expect(got).toEqual([1])
    expect(c.got.map((e) => e.n)).toEqual([1, 2])
    expect(hub.subscriberCount).toBe(1)
  })

  it('a listener added during a dispatch gets that event once (in its replay), then the later ones', () => {
    const hub = new ReplayHub<Ev>({ keep: () => 'all', limit: 10 })
    let late: number[] | null = null
    hub.subscribe(() => {
      if (late) return
      late = []
      const into = late
      hub.subscribe((x) => into.push(x.n))
    })
    hub.publish(ev('x', 1))
    hub.publish(ev('x', 2))
    expect(late!).toEqual([1, 2])
  })

  it('a publish from inside a listener is delivered after the current one, to everyone in the same order', () => {
    const hub = new ReplayHub<Ev>()
    const a: number[] = []
    const b: number[] = []
    hub.subscribe((e) => {
      a.push(e.n)
      if (e.n === 1) hub.publish(ev('x', 2))
    })
    hub.subscribe((e) => b.push(e.n))
    hub.publish(ev('x', 1))
    expect(a).toEqual([1, 2])
    expect(b).toEqual([1, 2])
  })

  it('a throwing listener is reported and neither the others nor the publisher notice', () => {
    const errors: unknown[] = []
    const hub = new ReplayHub<Ev>({ onError: (err) => errors.push(err) })
    hub.subscribe(() => {
      throw new Error('broken')
    })
    const ok = collect(hub)
    expect(() => hub.publish(ev('x', 1))).not.toThrow()
    expect(ok.got.map((e) => e.n)).toEqual([1])
    expect((errors[0] as Error).message).toBe('broken')
  })

  it('the bus keeps its contract on the hub: typed fan-out, isolated handlers, unsubscribe', () => {
    const bus = new EventBus() as unknown as {
      on(event: string, fn: (p: unknown) => void): () => void
      emit(event: string, p: unknown): void
    }
    const got: unknown[] = []
    const origError = console.error
    console.error = () => {}
    try {
      bus.on('t', () => {
        throw new Error('x')
      })
      const off = bus.on('t', (p) => got.push(p))
      bus.emit('t', 1)
      bus.emit('other', 2)
      off()
      bus.emit('t', 3)
    } finally {
      console.error = origError
    }
    expect(got).toEqual([1])
  })

  it('a channel kept before anyone listens is heard by later listeners, and says when nobody listens', () => {
    const bus = new EventBus()
    const channel = bus.channel('proxy.request')
    const event = {
      model: 'm',
      instance_id: null,
      status: 200,
      duration_ms: 1,
      ttft_ms: null,
      streamed: false,
      path: '/v1/completions',
    }
    expect(channel.heard).toBe(false)
    channel.emit(event) // nobody listens: dropped, not replayed later
    const got: unknown[] = []
    const off = bus.on('proxy.request', (e) => got.push(e.status))
    expect(channel.heard).toBe(true)
    channel.emit({ ...event, status: 201 })
    bus.emit('proxy.request', { ...event, status: 202 })
    off()
    expect(channel.heard).toBe(false)
    channel.emit({ ...event, status: 203 })
    expect(got).toEqual([201, 202])
  })
})

/** reads the SSE messages of a response until `count` arrived (throws if the stream ends first). */
async function readEvents(res: Response, count: number): Promise<number[]> {
  const messages = await readSse<Ev>(res, `${count} messages`, (evs) => evs.length >= count)
  return messages.map((m) => m.data.n)
}

describe('ReplayHub behind an SSE response', () => {
  const pad = 'x'.repeat(1000)
  const big = (n: number) => ({ kind: pad, n })
  const stream = (hub: ReplayHub<Ev>, maxBacklogBytes?: number) =>
    sseResponse((sink) => hub.subscribe((e) => sink.send('ev', e), { onEnd: () => sink.close() }), {
      maxBacklogBytes,
    })

  it('a client that stops reading is cut without holding up the publisher or the other clients', async () => {
    const hub = new ReplayHub<Ev>()
    const stalled = stream(hub, 64 * 1024)
    const reading = stream(hub)
    expect(hub.subscriberCount).toBe(2)
    for (let n = 1; n <= 100; n++) hub.publish(big(n))
    // The stalled client fell 64 KiB behind at about 64 events: it was cut and unsubscribed.
    expect(hub.subscriberCount).toBe(1)
    for (let n = 101; n <= 200; n++) hub.publish(big(n))
    hub.end()
    expect(await stalled.text().catch((e: Error) => e.message)).toBe(
      'the client stopped reading the event stream',
    )
    const got = await readEvents(reading, 200)
    expect(got).toEqual(Array.from({ length: 200 }, (_, i) => i + 1))
  })

  it('the replay a client is sent on connect does not count against its backlog', async () => {
    const hub = new ReplayHub<Ev>({ keep: () => 'all', limit: 500 })
    for (let n = 1; n <= 500; n++) hub.publish(big(n))
    const res = stream(hub, 16 * 1024)
    expect(hub.subscriberCount).toBe(1)
    for (let n = 501; n <= 510; n++) hub.publish(big(n))
    hub.end()
    const got = await readEvents(res, 510)
    expect(got.length).toBe(510)
    expect(got.at(-1)).toBe(510)
  })
})
