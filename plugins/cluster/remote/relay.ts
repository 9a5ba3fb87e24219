/**
 * relaySse passes a peer's event stream on byte for byte (its events, ids and heartbeats as the
 * owning pod wrote them). It ends when either side ends: the peer closing ends the client's stream,
 * the client leaving (its reader cancelling) aborts the peer's fetch through `cancel`. `done` runs
 * once, whichever side ended it, so the caller's abort listener never outlives the relay.
 */
export function relaySse(res: Response, cancel: AbortController, done: () => void): Response {
  const body = res.body
  let finished = false
  const finish = () => {
    if (finished) return
    finished = true
    done()
  }
  if (!body) {
    finish()
    return new Response('', { headers: sseHeaders() })
  }
  const reader = body.getReader()
  const stream = new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        try {
          const { value, done: end } = await reader.read()
          if (end) {
            finish()
            controller.close()
            return
          }
          controller.enqueue(value)
        } catch {
          finish()
          cancel.abort()
          controller.close()
        }
      },
      cancel() {
        finish()
        cancel.abort()
        reader.cancel().catch(() => {})
      },
    },
    { highWaterMark: 0 },
  )
  return new Response(stream, { headers: sseHeaders() })
}

function sseHeaders(): Record<string, string> {
  return {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache, no-transform',
    'x-accel-buffering': 'no',
  }
}
