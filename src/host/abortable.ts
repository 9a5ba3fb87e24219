/**
 * abortable: the one way to wait on a promise with a deadline. It settles as `p` does, unless
 * `signal` aborts first or `timeoutMs` passes first; then it rejects with a WaitError that names
 * what was awaited. `p` itself is not cancelled (pass the same signal to the work when it can stop).
 * Listeners and timers are removed as soon as it settles.
 */
export interface AbortableOptions {
  signal?: AbortSignal
  /** Omitted or ≤ 0: no deadline of its own. */
  timeoutMs?: number
  /** What is awaited, for the error message ("engine /health", "preset step 2"). */
  what?: string
}

export class WaitError extends Error {
  constructor(
    readonly kind: 'timeout' | 'aborted',
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options)
    this.name = kind === 'timeout' ? 'TimeoutError' : 'AbortError'
  }
}

export function abortable<T>(p: Promise<T>, opts: AbortableOptions = {}): Promise<T> {
  const { signal, timeoutMs = 0, what = 'the operation' } = opts
  const aborted = () => new WaitError('aborted', `${what} was aborted`, { cause: signal?.reason })
  if (signal?.aborted) {
    p.catch(() => {})
    return Promise.reject(aborted())
  }
  if (!signal && timeoutMs <= 0) return p
  return new Promise<T>((resolve, reject) => {
    let timer: ReturnType<typeof setTimeout> | undefined
    const done = () => {
      clearTimeout(timer)
      signal?.removeEventListener('abort', onAbort)
    }
    const onAbort = () => {
      done()
      reject(aborted())
    }
    signal?.addEventListener('abort', onAbort, { once: true })
    if (timeoutMs > 0)
      timer = setTimeout(() => {
        done()
        reject(new WaitError('timeout', `${what} did not finish within ${timeoutMs} ms`))
      }, timeoutMs)
    p.then(
      (v) => {
        done()
        resolve(v)
      },
      (e) => {
        done()
        reject(e)
      },
    )
  })
}

/**
 * pause resolves after `ms`, or at once when `signal` aborts; it never rejects, and its timer is
 * cleared on an abort (nothing lingers to hold the process). For loops that wait between tries.
 */
export function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve()
    const done = () => {
      clearTimeout(timer)
      signal?.removeEventListener('abort', done)
      resolve()
    }
    const timer = setTimeout(done, ms)
    signal?.addEventListener('abort', done, { once: true })
  })
}
