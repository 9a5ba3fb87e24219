import { AppError } from '../../../src/http/errors.ts'

/**
 * readEvents reads a peer's event stream (src/http/sse.ts's framing: `event:`, `data:`, `id:` lines,
 * `:` comments for heartbeats) and hands each event to `onEvent` until `onEvent` returns true (done),
 * the stream ends, or `signal` aborts. A stream silent for `idleMs` (no event, no heartbeat) counts as
 * a peer that went away: 504 PEER_SILENT. Resolves true when `onEvent` said done, false when the
 * stream ended first; the body is cancelled either way.
 */
export async function readEvents(
  res: Response,
  onEvent: (event: string, data: unknown) => boolean,
  opts: { signal: AbortSignal; idleMs: number; what: string },
): Promise<boolean> {
  const body = res.body
  if (!body) return false
  const reader = body.getReader()
  const decoder = new TextDecoder()
  let buf = ''
  let idle: ReturnType<typeof setTimeout> | undefined
  let silent = false
  const arm = () => {
    clearTimeout(idle)
    idle = setTimeout(() => {
      silent = true
      reader.cancel().catch(() => {})
    }, opts.idleMs)
  }
  const abort = () => {
    reader.cancel().catch(() => {})
  }
  opts.signal.addEventListener('abort', abort, { once: true })
  arm()
  try {
    for (;;) {
      if (opts.signal.aborted) opts.signal.throwIfAborted()
      const next = await reader.read()
      if (silent) throw new AppError(504, 'PEER_SILENT', `${opts.what}: no event for ${opts.idleMs} ms`)
      if (opts.signal.aborted) opts.signal.throwIfAborted()
      if (next.done) return false
      arm()
      buf += decoder.decode(next.value, { stream: true })
      for (let at = buf.indexOf('\n\n'); at >= 0; at = buf.indexOf('\n\n')) {
        const frame = buf.slice(0, at)
        buf = buf.slice(at + 2)
        let event = 'message'
        let data = ''
        for (const line of frame.split('\n')) {
          if (line.startsWith('event:')) event = line.slice(6).trim()
          else if (line.startsWith('data:')) data += line.slice(5).trimStart()
        }
        if (data === '') continue
        if (onEvent(event, JSON.parse(data))) return true
      }
    }
  } finally {
    clearTimeout(idle)
    opts.signal.removeEventListener('abort', abort)
    reader.cancel().catch(() => {})
  }
}
