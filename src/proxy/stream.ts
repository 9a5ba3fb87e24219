import type { AppError } from '../http/errors.ts'

/**
 * PipeHooks is how a streamed body reports to forward(), whichever transport carries it (the own
 * HTTP/1.1 client writes a direct stream, see http1.ts; the fetch transport uses pipeBody below).
 *
 * pipeBody wraps a fetch body in a pull-based stream for the client response, so that:
 *
 * - every upstream chunk is handed on as it arrives (no coalescing, no buffering);
 * - nothing is read from the engine until the client side asks for more (highWaterMark 0): a slow
 *   client pauses the upstream read and TCP backpressure reaches the engine, memory stays flat;
 * - the end is observed exactly once: last byte (`done`), upstream failure (`failed`) or the
 *   client going away (`cancel`, bun#28636: request.signal alone may not fire for streams);
 * - an SSE stream that breaks ends with a final `data: {"error": …}` event and `data: [DONE]`,
 *   so clients see an error instead of a hung or silently truncated stream.
 */
export interface PipeHooks {
  /** sse: the body is a text/event-stream (errors are reported in-band). */
  sse: boolean
  /** onFirstChunk runs when the first body bytes arrive. */
  onFirstChunk(): void
  /** failure maps an upstream read error to the error to report (timeouts vs disconnects). */
  failure(cause: unknown): AppError
  /** onCancel runs when the client stops reading (disconnect): abort the upstream request. */
  onCancel(): void
  /** onDone runs once at the end: `error` is set when the upstream failed. */
  onDone(error: AppError | null): void
}

const encoder = new TextEncoder()
export const LF = 10

/**
 * sseErrorEnding: the bytes that end a broken event stream: a blank line to close whatever event
 * was cut short (given the last two bytes sent), the error event in the proxy shape, and [DONE].
 */
export function sseErrorEnding(error: AppError, last: number, beforeLast: number): Uint8Array {
  const prefix = last === LF ? (beforeLast === LF ? '' : '\n') : '\n\n'
  return encoder.encode(`${prefix}data: ${JSON.stringify(error.toProxy())}\n\ndata: [DONE]\n\n`)
}

export function pipeBody(
  body: ReadableStream<Uint8Array>,
  /** progress.bytes counts the bytes handed on so far. */
  progress: { bytes: number },
  hooks: PipeHooks,
): ReadableStream<Uint8Array> {
  const reader = body.getReader()
  let first = true
  let finished = false
  // The last two bytes sent, to close a partial SSE event before appending the error event.
  let last = LF
  let beforeLast = LF

  const finish = (error: AppError | null) => {
    if (finished) return
    finished = true
    hooks.onDone(error)
  }

  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let chunk: Awaited<ReturnType<typeof reader.read>>
        try {
          chunk = await reader.read()
        } catch (cause) {
          if (finished) return
          const error = hooks.failure(cause)
          finish(error)
          if (hooks.sse) {
            try {
              controller.enqueue(sseErrorEnding(error, last, beforeLast))
              controller.close()
            } catch {
              // the client went away meanwhile
            }
          } else {
            try {
              controller.error(cause)
            } catch {
              // already closed
            }
          }
          return
        }
        if (finished) return
        if (chunk.done) {
          finish(null)
          controller.close()
          return
        }
        const value = chunk.value
        const n = value.byteLength
        if (n === 0) return
        if (first) {
          first = false
          hooks.onFirstChunk()
        }
        progress.bytes += n
        beforeLast = n > 1 ? value[n - 2]! : last
        last = value[n - 1]!
        controller.enqueue(value)
      },
      cancel() {
        if (!finished) {
          finished = true
          hooks.onCancel()
          hooks.onDone(null)
        }
        reader.cancel().catch(() => {})
      },
    },
    { highWaterMark: 0 },
  )
}
