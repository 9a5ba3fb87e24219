import { inspect } from 'node:util'
import { abortable } from '../../src/host/abortable.ts'

/**
 * waitFor: the tests' one way to wait for something to become true. It calls `check` until it
 * returns a value other than undefined, null or false, and returns that value. `wake` subscribes it to
 * the event that changes the answer (a bus event, a socket's data, a process's output): it checks
 * again at once on each. Without `wake`, or between wakes, it polls every `pollMs`.
 *
 * At the deadline it throws `timed out after N ms waiting for <what>; last value: …` (the check's last
 * answer, or what `show` describes). An error thrown by `check` ends the wait at once with that
 * error: a check throws when what it waits for can no longer happen (the process exited).
 */
export interface WaitOptions {
  /** Default 10 000 ms; a test that waits on something slower sets more. */
  timeoutMs?: number
  signal?: AbortSignal
  /** wake subscribes `notify` to whatever changes the answer; it returns the unsubscribe. */
  wake?: (notify: () => void) => () => void
  /** Polling interval (default 10 ms, or 100 ms as a safety net when `wake` is given). */
  pollMs?: number
  /** show describes the state for the timeout message (default: the check's last answer). */
  show?: () => unknown
}

export type Check<T> = () => T | undefined | null | false | Promise<T | undefined | null | false>

export async function waitFor<T>(what: string, check: Check<T>, opts: WaitOptions = {}): Promise<T> {
  const timeoutMs = opts.timeoutMs ?? 10_000
  const pollMs = opts.pollMs ?? (opts.wake ? 100 : 10)
  const timer = new AbortController()
  const deadline = setTimeout(() => timer.abort(), timeoutMs)
  const signal = opts.signal ? AbortSignal.any([opts.signal, timer.signal]) : timer.signal
  let notify = () => {}
  const unsubscribe = opts.wake?.(() => notify())
  let last: unknown
  try {
    for (;;) {
      // A wake that comes while the check runs is kept, so the change it reports is never missed.
      let woken = false
      notify = () => {
        woken = true
      }
      const answer = await abortable(Promise.resolve(check()), { signal, what })
      if (answer !== undefined && answer !== null && answer !== false) return answer
      last = answer
      if (woken) continue
      const next = Promise.withResolvers<void>()
      notify = next.resolve
      const poll = setTimeout(next.resolve, pollMs)
      try {
        await abortable(next.promise, { signal, what })
      } finally {
        clearTimeout(poll)
      }
    }
  } catch (err) {
    if (!timer.signal.aborted || opts.signal?.aborted) throw err
    const shown = opts.show ? opts.show() : last
    throw new Error(
      `timed out after ${timeoutMs} ms waiting for ${what}; last value: ${inspect(shown, { depth: 4, breakLength: Infinity })}`,
    )
  } finally {
    clearTimeout(deadline)
    unsubscribe?.()
  }
}
