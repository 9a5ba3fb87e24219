import { ApiError, auth, authHeaders, errorFrom } from './api.ts'

/**
 * Server-Sent Events over fetch rather than EventSource: fetch sends the JWT in the Authorization
 * header, so the token never appears in a URL (EventSource could only pass it as `?token=`, which
 * lands in access logs and history), and a refused stream comes back with its error message.
 */
export interface SseMessage {
  event: string
  data: string
}

/** sseMessages parses a text/event-stream body into messages (comments and ids are skipped). */
export async function* sseMessages(body: ReadableStream<Uint8Array>): AsyncGenerator<SseMessage> {
  const reader = body.getReader()
  const decoder = new TextDecoder()
  let buffer = ''
  try {
    for (;;) {
      const { value, done } = await reader.read()
      if (done) return
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n')
      let end = buffer.indexOf('\n\n')
      while (end >= 0) {
        const block = buffer.slice(0, end)
        buffer = buffer.slice(end + 2)
        let event = 'message'
        const data: string[] = []
        for (const line of block.split('\n')) {
          if (line.startsWith('event:')) event = line.slice(6).trim()
          else if (line.startsWith('data:')) data.push(line.slice(line.startsWith('data: ') ? 6 : 5))
        }
        if (data.length) yield { event, data: data.join('\n') }
        end = buffer.indexOf('\n\n')
      }
    }
  } finally {
    reader.releaseLock()
  }
}

export interface StreamHandlers {
  /** onOpen: the server accepted the stream (again, after a reconnect). */
  onOpen?(): void
  onMessage(m: SseMessage): void
  /** onDown: the stream failed or ended; it is retried unless `final` (404, 401, 403: it cannot succeed). */
  onDown?(err: ApiError, final: boolean): void
}

const RETRY_MS = [1000, 2000, 5000, 10000]

/**
 * followStream keeps an event stream open: it reconnects after a drop (backing off up to 10 s) and
 * stops for good on an answer that cannot change (401, 403, 404). Returns the function that closes it.
 */
export function followStream(path: string, h: StreamHandlers): () => void {
  const stop = new AbortController()
  let attempt = 0
  const run = async () => {
    while (!stop.signal.aborted) {
      let failure: ApiError
      try {
        const res = await fetch(path, {
          headers: authHeaders({ accept: 'text/event-stream' }),
          signal: stop.signal,
        })
        if (!res.ok || !res.body) {
          failure = await errorFrom(res)
          const final = [401, 403, 404].includes(res.status)
          if (res.status === 401 && auth.token) auth.onUnauthorized(failure.message)
          h.onDown?.(failure, final)
          if (final) return
        } else {
          attempt = 0
          h.onOpen?.()
          for await (const m of sseMessages(res.body)) h.onMessage(m)
          h.onDown?.(new ApiError(0, 'STREAM_ENDED', 'The event stream ended'), false)
        }
      } catch {
        if (stop.signal.aborted) return
        h.onDown?.(new ApiError(0, 'NETWORK_ERROR', 'The event stream was cut'), false)
      }
      const wait = RETRY_MS[Math.min(attempt++, RETRY_MS.length - 1)]
      await new Promise((resolve) => {
        const t = setTimeout(resolve, wait)
        stop.signal.addEventListener('abort', () => {
          clearTimeout(t)
          resolve(undefined)
        })
      })
    }
  }
  void run()
  return () => stop.abort()
}
