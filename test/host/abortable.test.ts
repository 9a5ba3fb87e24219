import { describe, expect, it } from 'bun:test'
import { abortable, WaitError } from '../../src/host/abortable.ts'

describe('abortable', () => {
  it('settles as the promise does when nothing interrupts it', async () => {
    expect(
      await abortable(Promise.resolve(7), { timeoutMs: 1000, signal: new AbortController().signal }),
    ).toBe(7)
    await expect(abortable(Promise.reject(new Error('boom')), { timeoutMs: 1000 })).rejects.toThrow('boom')
  })

  it('rejects with a WaitError naming what was awaited when the signal aborts', async () => {
    const ac = new AbortController()
    const never = new Promise<never>(() => {})
    const waiting = abortable(never, { signal: ac.signal, what: 'engine /health' })
    ac.abort(new Error('shutdown'))
    const err = await waiting.catch((e: unknown) => e)
    expect(err).toBeInstanceOf(WaitError)
    expect((err as WaitError).kind).toBe('aborted')
    expect((err as WaitError).message).toBe('engine /health was aborted')
    expect(((err as WaitError).cause as Error).message).toBe('shutdown')
  })

  it('rejects at once when the signal has already aborted', async () => {
    const err = await abortable(Promise.resolve(1), { signal: AbortSignal.abort() }).catch((e: unknown) => e)
    expect((err as WaitError).kind).toBe('aborted')
  })

  it('rejects with a timeout WaitError when the deadline passes first', async () => {
    const err = await abortable(new Promise<never>(() => {}), { timeoutMs: 5, what: 'preset step' }).catch(
      (e: unknown) => e,
    )
    expect(err).toBeInstanceOf(WaitError)
    expect((err as WaitError).kind).toBe('timeout')
    expect((err as WaitError).name).toBe('TimeoutError')
    expect((err as WaitError).message).toBe('preset step did not finish within 5 ms')
  })

  it('removes its abort listener once settled', async () => {
    const ac = new AbortController()
    let added = 0
    let removed = 0
    const signal = ac.signal
    const add = signal.addEventListener.bind(signal)
    const remove = signal.removeEventListener.bind(signal)
    signal.addEventListener = ((...a: Parameters<typeof add>) => {
      added++
      return add(...a)
    }) as typeof signal.addEventListener
    signal.removeEventListener = ((...a: Parameters<typeof remove>) => {
      removed++
      return remove(...a)
    }) as typeof signal.removeEventListener
    for (let i = 0; i < 3; i++) await abortable(Promise.resolve(i), { signal })
    expect(added).toBe(3)
    expect(removed).toBe(3)
  })
})
