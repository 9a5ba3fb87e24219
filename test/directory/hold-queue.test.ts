import { describe, expect, it } from 'bun:test'
import { Displaced, HoldQueue, queueShare } from '../../src/directory/hold-queue.ts'

/** The hold queue in-process: places, shares of a bounded queue, priorities, releases. */
const seat = (priority: number, party: string | null, share: number | null = null) => ({
  priority,
  party,
  share,
})

describe('the hold queue', () => {
  it("a key's share: half the queue, at least 1, or its max_concurrent when that says more", () => {
    expect(queueShare(4, null)).toBe(2)
    expect(queueShare(5, null)).toBe(2)
    expect(queueShare(1, null)).toBe(1)
    expect(queueShare(10, 8)).toBe(8)
    expect(queueShare(10, 2)).toBe(5)
    expect(queueShare(4, 100)).toBe(4)
  })

  it('a party at its share is refused while others still get places; no party is bound by the queue alone', () => {
    const q = new HoldQueue()
    const wake = Promise.withResolvers<void>()
    expect(q.enter(seat(1, 'a', 2), wake.promise, 4)).not.toBeNull()
    expect(q.enter(seat(1, 'a', 2), wake.promise, 4)).not.toBeNull()
    expect(q.hasRoom(seat(1, 'a', 2), 4)).toBe(false)
    expect(q.enter(seat(0, 'a', 2), wake.promise, 4)).toBeNull()
    expect(q.hasRoom(seat(1, 'b', 2), 4)).toBe(true)
    expect(q.enter(seat(1, 'b', 2), wake.promise, 4)).not.toBeNull()
    expect(q.enter(seat(1, null), wake.promise, 4)).not.toBeNull()
    expect(q.size).toBe(4)
    expect(q.waiting('a')).toBe(2)
  })

  it('a waiter that leaves gives its party its place back', () => {
    const q = new HoldQueue()
    const wake = Promise.withResolvers<void>()
    const w = q.enter(seat(1, 'a', 1), wake.promise, 4)!
    expect(q.enter(seat(1, 'a', 1), wake.promise, 4)).toBeNull()
    q.leave(w)
    q.leave(w)
    expect(q.waiting('a')).toBe(0)
    expect(q.enter(seat(1, 'a', 1), wake.promise, 4)).not.toBeNull()
  })

  it('priority still orders within the queue, and displaces the newest lowest in a full one', async () => {
    const q = new HoldQueue()
    const wake = Promise.withResolvers<void>()
    const order: string[] = []
    const low = q.enter(seat(2, 'a', 2), wake.promise, 3)!
    const normal = q.enter(seat(1, 'b', 2), wake.promise, 3)!
    const low2 = q.enter(seat(2, 'c', 2), wake.promise, 3)!
    const high = q.enter(seat(0, 'd', 2), wake.promise, 3)!
    await expect(low2.done).rejects.toBeInstanceOf(Displaced)
    expect(q.waiting('c')).toBe(0)
    for (const [name, w] of [
      ['low', low],
      ['normal', normal],
      ['high', high],
    ] as const)
      void w.done.then(() => order.push(name))
    wake.resolve()
    await Promise.all([low.done, normal.done, high.done])
    expect(order).toEqual(['high', 'normal', 'low'])
    expect(q.size).toBe(0)
    expect(q.waiting('a')).toBe(0)
  })
})
