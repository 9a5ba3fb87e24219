import { useEffect, useRef, useState } from 'preact/hooks'
import { followStream } from '../../../../../src/dashboard/client/sse.ts'

/**
 * LogView: an instance's engine log, live from its event stream (the buffered lines first), with
 * status changes and errors marked. It keeps the last MAX_LINES and follows the tail unless the
 * operator has scrolled up.
 */
const MAX_LINES = 1000

interface Line {
  n: number
  kind: 'stdout' | 'stderr' | 'status' | 'error'
  text: string
}

export function LogView({ instanceId }: { instanceId: string }) {
  const [lines, setLines] = useState<Line[]>([])
  const [state, setState] = useState('connecting')
  const box = useRef<HTMLPreElement>(null)
  /** stick: the operator is at the end of the log (so new lines scroll it). */
  const stick = useRef(true)
  useEffect(() => {
    let n = 0
    let buffer: Line[] = []
    const push = (kind: Line['kind'], text: string) => {
      buffer = [...buffer, { n: n++, kind, text }].slice(-MAX_LINES)
      setLines(buffer)
    }
    const path = `/api/v1/models/instances/${encodeURIComponent(instanceId)}/events?types=log,status,error&replay_logs=true`
    return followStream(path, {
      onOpen: () => {
        buffer = []
        setLines(buffer)
        setState('live')
      },
      onMessage: (m) => {
        const e = JSON.parse(m.data) as { data: Record<string, unknown> }
        if (m.event === 'log') push(e.data.stream === 'stderr' ? 'stderr' : 'stdout', String(e.data.content))
        else if (m.event === 'status')
          push(
            'status',
            `status: ${e.data.previousStatus ?? '—'} → ${e.data.currentStatus}: ${e.data.message ?? ''}`,
          )
        else if (m.event === 'error') push('error', `error (${e.data.source}): ${e.data.message}`)
      },
      onDown: (err, final) => setState(final ? `ended: ${err.message}` : 'reconnecting'),
    })
  }, [instanceId])
  useEffect(() => {
    const el = box.current
    if (el && stick.current) el.scrollTop = el.scrollHeight
  }, [lines])
  const onScroll = () => {
    const el = box.current
    if (el) stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40
  }
  return (
    <section class="card logs">
      <h3>
        Engine log <span class="muted small">({state})</span>
      </h3>
      <pre ref={box} class="log" aria-live="off" onScroll={onScroll}>
        {lines.map((l) => (
          <div key={l.n} class={`line ${l.kind}`}>
            {l.text}
          </div>
        ))}
      </pre>
    </section>
  )
}
