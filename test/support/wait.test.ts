import { describe, expect, it } from 'bun:test'
import { readSse } from './sse.ts'
import { waitFor } from './wait.ts'

/** The tests' one wait and their one event-stream reader: they end on the event or throw naming it. */
describe('waitFor', () => {
  it('returns the first answer that is not undefined, null or false', async () => {
    let n = 0
    expect(await waitFor('the third call', () => (++n >= 3 ? n : false))).toBe(3)
  })

  it('throws at the deadline naming what it waited for and the last answer', async () => {
    let n = 0
    await expect(
      waitFor('a counter past 1000', () => (++n > 1000 ? n : undefined), { timeoutMs: 50 }),
    ).rejects.toThrow(/^timed out after 50 ms waiting for a counter past 1000; last value: undefined$/)
    await expect(
      waitFor('a counter past 1000', () => false, { timeoutMs: 30, show: () => ({ n: 7 }) }),
    ).rejects.toThrow('timed out after 30 ms waiting for a counter past 1000; last value: { n: 7 }')
  })

  it('ends at once with the error a check throws', async () => {
    let checks = 0
    await expect(
      waitFor('nothing', () => {
        checks++
        throw new Error('the process exited')
      }),
    ).rejects.toThrow('the process exited')
    // At once: the first check's error ends the wait, not a later one nor its deadline.
    expect(checks).toBe(1)
  })

  it('checks again on each wake, without waiting for its poll', async () => {
    let ready = false
    const listeners = new Set<() => void>()
    const waiting = waitFor('the flag', () => ready, {
      pollMs: 60_000,
      wake: (notify) => {
        listeners.add(notify)
        return () => listeners.delete(notify)
      },
    })
    // Let it answer false and settle into its 60 s poll, then wake it.
    await new Promise((resolve) => setImmediate(resolve))
    ready = true
    for (const f of listeners) f()
    expect(await waiting).toBe(true)
    expect(listeners.size).toBe(0)
  })

  it('gives way to its signal', async () => {
    const ac = new AbortController()
    const waiting = waitFor('never', () => false, { signal: ac.signal })
    ac.abort()
    await expect(waiting).rejects.toThrow('never was aborted')
  })
})

describe('readSse', () => {
  const sse = (frames: string[], end: boolean) =>
    new Response(
      new ReadableStream({
        start(c) {
          for (const f of frames) c.enqueue(new TextEncoder().encode(f))
          if (end) c.close()
        },
      }),
    )

  it('returns the messages once `until` holds', async () => {
    const got = await readSse(
      sse(['event: a\ndata: 1\n\n', 'data: 2\n\n'], false),
      'two messages',
      (m) => m.length === 2,
    )
    expect(got).toEqual([
      { event: 'a', data: 1 },
      { event: 'message', data: 2 },
    ])
  })

  it('throws when the stream ends before `until` holds, or when its budget runs out', async () => {
    await expect(readSse(sse(['data: 1\n\n'], true), 'two messages', (m) => m.length === 2)).rejects.toThrow(
      'the event stream ended before two messages',
    )
    await expect(
      readSse(sse(['data: 1\n\n'], false), 'two messages', (m) => m.length === 2, 50),
    ).rejects.toThrow(/^timed out after 50 ms waiting for two messages; last value: \{ count: 1/)
  })

  it('reads to the end without `until`', async () => {
    expect(await readSse(sse(['data: 1\n\n', 'data: 2\n\n'], true), 'the end')).toHaveLength(2)
  })
})
