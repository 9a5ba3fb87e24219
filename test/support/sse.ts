import { waitFor } from './wait.ts'

export interface SseMessage<D = unknown> {
  event: string
  data: D
}

/**
 * readSse reads an event stream until `until(messages)` holds (without `until`: until the stream
 * ends) and returns the messages so far, then lets the stream go. It never returns short: a stream
 * that ends first, or a budget that runs out, throws naming `what` and listing what did arrive.
 */
export async function readSse<D = unknown>(
  res: Response,
  what: string,
  until?: (messages: SseMessage<D>[]) => boolean,
  timeoutMs = 15_000,
): Promise<SseMessage<D>[]> {
  if (res.status !== 200) throw new Error(`${what}: the event stream answered HTTP ${res.status}`)
  const messages: SseMessage<D>[] = []
  const reader = res.body!.getReader()
  let ended = false
  let failed: unknown
  const listeners = new Set<() => void>()
  const pump = (async () => {
    const decoder = new TextDecoder()
    let buf = ''
    try {
      for (;;) {
        const next = await reader.read()
        if (next.done) break
        buf += decoder.decode(next.value, { stream: true })
        for (let idx = buf.indexOf('\n\n'); idx >= 0; idx = buf.indexOf('\n\n')) {
          const frame = buf.slice(0, idx)
          buf = buf.slice(idx + 2)
          let event = 'message'
          let data = ''
          for (const line of frame.split('\n')) {
            if (line.startsWith('event: ')) event = line.slice(7)
            else if (line.startsWith('data: ')) data += line.slice(6)
          }
          if (data) messages.push({ event, data: JSON.parse(data) as D })
        }
        for (const f of listeners) f()
      }
    } catch (err) {
      failed = err
    } finally {
      ended = true
      for (const f of listeners) f()
    }
  })()
  const show = () => ({ count: messages.length, last: messages.slice(-3) })
  try {
    await waitFor(
      what,
      () => {
        if (until?.(messages)) return true
        if (failed !== undefined) throw new Error(`${what}: the event stream failed: ${failed}`)
        if (!ended) return false
        if (!until) return true
        throw new Error(`the event stream ended before ${what}; got: ${JSON.stringify(show())}`)
      },
      {
        timeoutMs,
        show,
        wake: (notify) => {
          listeners.add(notify)
          return () => listeners.delete(notify)
        },
      },
    )
  } finally {
    await reader.cancel().catch(() => {})
    await pump
  }
  return messages
}
