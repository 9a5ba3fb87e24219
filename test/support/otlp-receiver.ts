/**
 * OtlpReceiver: an OTLP/HTTP trace collector standing at the process boundary, for the tests. It
 * decodes what the real exporter sends (`POST /v1/traces`, OTLP's JSON encoding: ids in hex,
 * attributes as AnyValue) into flat spans; anything else it refuses (415), so a change of encoding
 * shows as lost spans rather than passing unread. `waitForSpans` waits on arrivals, never on time.
 */
export interface ReceivedSpan {
  traceId: string
  spanId: string
  parentSpanId: string
  name: string
  kind: number
  attributes: Record<string, unknown>
  events: { name: string; attributes: Record<string, unknown> }[]
  status: { code: number; message: string }
  start: number
  end: number
  resource: Record<string, unknown>
}

type AnyValue = {
  stringValue?: string
  intValue?: string | number
  doubleValue?: number
  boolValue?: boolean
  arrayValue?: { values?: AnyValue[] }
}
type KeyValue = { key: string; value: AnyValue }

function decodeValue(v: AnyValue): unknown {
  if (v.stringValue !== undefined) return v.stringValue
  if (v.intValue !== undefined) return Number(v.intValue)
  if (v.doubleValue !== undefined) return v.doubleValue
  if (v.boolValue !== undefined) return v.boolValue
  if (v.arrayValue) return (v.arrayValue.values ?? []).map(decodeValue)
  return null
}

function decodeAttributes(list: KeyValue[] | undefined): Record<string, unknown> {
  return Object.fromEntries((list ?? []).map((kv) => [kv.key, decodeValue(kv.value)]))
}

const nanos = (v: string | number | undefined) => Number(v ?? 0) / 1e6

export class OtlpReceiver {
  readonly spans: ReceivedSpan[] = []
  /** requests: every export received (headers included), for the header tests. */
  readonly requests: { headers: Headers; spans: number }[] = []
  private readonly server: ReturnType<typeof Bun.serve>
  private waiters = new Set<() => void>()

  constructor() {
    this.server = Bun.serve({
      hostname: '127.0.0.1',
      port: 0,
      fetch: async (req) => {
        const url = new URL(req.url)
        if (req.method !== 'POST' || url.pathname !== '/v1/traces')
          return new Response('not found', { status: 404 })
        if (!(req.headers.get('content-type') ?? '').startsWith('application/json'))
          return new Response('only OTLP JSON is decoded here', { status: 415 })
        const body = (await req.json()) as {
          resourceSpans?: {
            resource?: { attributes?: KeyValue[] }
            scopeSpans?: { spans?: Record<string, unknown>[] }[]
          }[]
        }
        let n = 0
        for (const rs of body.resourceSpans ?? []) {
          const resource = decodeAttributes(rs.resource?.attributes)
          for (const ss of rs.scopeSpans ?? [])
            for (const s of ss.spans ?? []) {
              n++
              this.spans.push({
                traceId: String(s.traceId),
                spanId: String(s.spanId),
                parentSpanId: String(s.parentSpanId ?? ''),
                name: String(s.name),
                kind: Number(s.kind),
                attributes: decodeAttributes(s.attributes as KeyValue[]),
                events: ((s.events ?? []) as { name: string; attributes?: KeyValue[] }[]).map((e) => ({
                  name: e.name,
                  attributes: decodeAttributes(e.attributes),
                })),
                status: {
                  code: Number((s.status as { code?: number })?.code ?? 0),
                  message: String((s.status as { message?: string })?.message ?? ''),
                },
                start: nanos(s.startTimeUnixNano as string),
                end: nanos(s.endTimeUnixNano as string),
                resource,
              })
            }
        }
        this.requests.push({ headers: req.headers, spans: n })
        for (const w of this.waiters) w()
        return Response.json({ partialSuccess: {} })
      },
    })
  }

  get url(): string {
    return `http://127.0.0.1:${this.server.port}`
  }

  named(name: string): ReceivedSpan[] {
    return this.spans.filter((s) => s.name === name)
  }

  trace(traceId: string): ReceivedSpan[] {
    return this.spans.filter((s) => s.traceId === traceId)
  }

  /** waitForSpans resolves once `ok(spans)` holds, or rejects after `timeoutMs` naming `what`. */
  waitForSpans(ok: (spans: ReceivedSpan[]) => boolean, what: string, timeoutMs = 10_000): Promise<void> {
    if (ok(this.spans)) return Promise.resolve()
    return new Promise((resolve, reject) => {
      const check = () => {
        if (!ok(this.spans)) return
        cleanup()
        resolve()
      }
      const timer = setTimeout(() => {
        cleanup()
        reject(
          new Error(
            `timed out after ${timeoutMs} ms waiting for ${what}; got ${this.spans.map((s) => s.name).join(', ') || 'no span'}`,
          ),
        )
      }, timeoutMs)
      const cleanup = () => {
        clearTimeout(timer)
        this.waiters.delete(check)
      }
      this.waiters.add(check)
    })
  }

  stop(): void {
    this.server.stop(true)
  }
}

/** childrenOf: the spans whose parent is `span`, in start order. */
export function childrenOf(spans: ReceivedSpan[], span: ReceivedSpan): ReceivedSpan[] {
  return spans.filter((s) => s.parentSpanId === span.spanId).sort((a, b) => a.start - b.start)
}
