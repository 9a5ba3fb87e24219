/**
 * sseResponse streams Server-Sent Events with heartbeats (comment lines) so proxies and Bun's idle
 * timeout never cut a quiet stream. The producer gets `send` and `close` and returns a cleanup; the
 * cleanup runs exactly once, when the producer closes or the client goes away.
 *
 * `send` never blocks the producer: a message is queued for the client. A client that stops reading
 * is cut once the messages it has not read outgrow what `start` queued (the replay) by
 * `maxBacklogBytes`; its EventSource reconnects and gets the replay again.
 */
export interface SseSink {
  send(event: string, data: unknown, id?: string): void
  close(): void
  readonly closed: boolean
}

export interface SseOptions {
  heartbeatMs?: number
  signal?: AbortSignal
  /** Unread bytes beyond the replay after which a client is cut (default 1 MiB). */
  maxBacklogBytes?: number
}

const encoder = new TextEncoder()

export function formatSse(event: string, data: unknown, id?: string): string {
  const json = typeof data === 'string' ? data : JSON.stringify(data)
  return `${id ? `id: ${id}\n` : ''}event: ${event}\ndata: ${json}\n\n`
}

export function sseResponse(
  start: (sink: SseSink) => (() => void) | undefined,
  opts: SseOptions = {},
): Response {
  let cleanup: (() => void) | undefined
  let heartbeat: ReturnType<typeof setInterval> | undefined
  let closed = false
  let controllerRef: ReadableStreamDefaultController<Uint8Array> | undefined
  // With a high-water mark of 0, -desiredSize is the number of bytes the client has not read.
  let maxUnread = Number.POSITIVE_INFINITY
  const finish = () => {
    if (closed) return
    closed = true
    if (heartbeat) clearInterval(heartbeat)
    opts.signal?.removeEventListener('abort', finish)
    try {
      cleanup?.()
    } finally {
      try {
        controllerRef?.close()
      } catch {
        // already closed by the client
      }
    }
  }
  const stream = new ReadableStream<Uint8Array>(
    {
      start(controller) {
        controllerRef = controller
        const sink: SseSink = {
          send(event, data, id) {
            if (closed) return
            try {
              controller.enqueue(encoder.encode(formatSse(event, data, id)))
            } catch {
              finish()
              return
            }
            if (-(controller.desiredSize ?? 0) > maxUnread) {
              controller.error(new Error('the client stopped reading the event stream'))
              finish()
            }
          },
          close: () => finish(),
          get closed() {
            return closed
          },
        }
        controller.enqueue(encoder.encode(': connected\n\n'))
        heartbeat = setInterval(() => {
          if (!closed) {
            try {
              controller.enqueue(encoder.encode(': heartbeat\n\n'))
            } catch {
              finish()
            }
          }
        }, opts.heartbeatMs ?? 15000)
        opts.signal?.addEventListener('abort', finish, { once: true })
        cleanup = start(sink)
        if (closed) cleanup?.()
        maxUnread = -(controller.desiredSize ?? 0) + (opts.maxBacklogBytes ?? 1024 * 1024)
      },
      cancel() {
        finish()
      },
    },
    { highWaterMark: 0, size: (chunk) => chunk?.byteLength ?? 0 },
  )
  return new Response(stream, {
    headers: {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache, no-transform',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    },
  })
}
