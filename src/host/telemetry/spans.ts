import {
  type Attributes,
  type AttributeValue,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api'
import { formatTraceparent } from './traceparent.ts'

/**
 * The spans modelgate hands out: a thin wrapper over an OpenTelemetry span, with parents passed
 * explicitly (no context manager: the request path is callbacks on sockets, where async context
 * would cost on every request and follow the wrong thing). `NOOP_SPAN` stands in when tracing is
 * off, so admin code calls the same methods either way; the request path gets `null` instead.
 */
export type SpanAttributes = Record<string, AttributeValue | undefined>

/** ChildOptions: a client span (a call to another process), or a span that began earlier (a phase seen after the fact). */
export interface ChildOptions {
  kind?: 'internal' | 'client'
  /** when the span began: epoch milliseconds (Date.now(), or performance.timeOrigin + performance.now()). */
  startTime?: number
}

export interface SpanBase {
  /** child starts a span under this one, now (or at `startTime`). */
  child(name: string, attrs?: SpanAttributes, opts?: ChildOptions): TraceSpan
  /** event adds a timestamped event (`first_token`, `held`). */
  event(name: string, attrs?: SpanAttributes): void
  setAttributes(attrs: SpanAttributes): void
  /** inject: the `traceparent` header value that makes this span the parent of the receiver's spans. */
  inject(): string
  /** traceId: 32 hex digits. */
  readonly traceId: string
  /**
   * recording: the span is sampled and will be exported. A span that is not still carries its
   * context on (`inject`), so work done only to fill in attributes can be skipped when it is false.
   */
  readonly recording: boolean
}

/** TraceSpan: an admin operation, a phase, a hop or an engine call. */
export interface TraceSpan extends SpanBase {
  /** end: ends the span; with `error` its status is ERROR with that message. Later calls do nothing. */
  end(error?: string): void
}

/** RequestTrace: the server span of one inference request (HTTP and GenAI conventions). */
export interface RequestTrace extends SpanBase {
  /** firstToken: the first byte of the answer reached the client (TTFT attribute and event); once. */
  firstToken(): void
  /** usage: token counts and finish reasons, when the path knows them (an engine's `usage`). */
  usage(u: { inputTokens?: number; outputTokens?: number; finishReasons?: string[] }): void
  /** end: the response's status; 5xx (or `error`) marks the span ERROR. Later calls do nothing. */
  end(status: number, error?: string): void
}

const KIND = { internal: SpanKind.INTERNAL, client: SpanKind.CLIENT } as const

/** clean drops undefined values (OTel keeps only defined attribute values). */
function clean(attrs: SpanAttributes | undefined): Attributes | undefined {
  if (!attrs) return undefined
  const out: Attributes = {}
  for (const k in attrs) {
    const v = attrs[k]
    if (v !== undefined) out[k] = v
  }
  return out
}

class OtelSpanBase {
  private ended = false

  constructor(
    protected readonly tracer: Tracer,
    protected readonly span: Span,
  ) {}

  get traceId(): string {
    return this.span.spanContext().traceId
  }

  get recording(): boolean {
    return this.span.isRecording()
  }

  child(name: string, attrs?: SpanAttributes, opts?: ChildOptions): TraceSpan {
    const ctx = trace.setSpan(ROOT_CONTEXT, this.span)
    const a = clean(attrs)
    const span = this.tracer.startSpan(
      name,
      {
        kind: KIND[opts?.kind ?? 'internal'],
        ...(a ? { attributes: a } : {}),
        ...(opts?.startTime !== undefined ? { startTime: opts.startTime } : {}),
      },
      ctx,
    )
    return new OtelSpan(this.tracer, span)
  }

  event(name: string, attrs?: SpanAttributes): void {
    this.span.addEvent(name, clean(attrs))
  }

  setAttributes(attrs: SpanAttributes): void {
    const a = clean(attrs)
    if (a) this.span.setAttributes(a)
  }

  inject(): string {
    const c = this.span.spanContext()
    return formatTraceparent(c.traceId, c.spanId, c.traceFlags)
  }

  /** finish: ends the span once; `error` sets status ERROR. */
  protected finish(error: string | undefined): void {
    if (this.ended) return
    this.ended = true
    if (error !== undefined) this.span.setStatus({ code: SpanStatusCode.ERROR, message: error })
    this.span.end()
  }
}

export class OtelSpan extends OtelSpanBase implements TraceSpan {
  end(error?: string): void {
    this.finish(error)
  }
}

export class OtelRequestTrace extends OtelSpanBase implements RequestTrace {
  private readonly startedAt = performance.now()
  private sawFirstToken = false

  firstToken(): void {
    if (this.sawFirstToken) return
    this.sawFirstToken = true
    const seconds = (performance.now() - this.startedAt) / 1000
    this.span.setAttribute('gen_ai.server.time_to_first_token', seconds)
    this.span.addEvent('gen_ai.first_token')
  }

  usage(u: { inputTokens?: number; outputTokens?: number; finishReasons?: string[] }): void {
    this.setAttributes({
      'gen_ai.usage.input_tokens': u.inputTokens,
      'gen_ai.usage.output_tokens': u.outputTokens,
      'gen_ai.response.finish_reasons': u.finishReasons,
    })
  }

  end(status: number, error?: string): void {
    this.span.setAttribute('http.response.status_code', status)
    // Server spans: 4xx is the client's doing, not an error of this service (OTel HTTP conventions).
    if (error === undefined && status >= 500) error = `HTTP ${status}`
    if (error !== undefined) this.span.setAttribute('error.type', String(status))
    this.finish(error)
  }
}

/** NOOP_SPAN: what admin code gets with tracing off; every call does nothing and allocates nothing. */
export const NOOP_SPAN: TraceSpan = {
  traceId: '',
  recording: false,
  child: () => NOOP_SPAN,
  event: () => {},
  setAttributes: () => {},
  inject: () => '',
  end: () => {},
}

/**
 * PhaseSpans: consecutive phases of one operation as children of its span (a load's spawn,
 * weights, KV cache, ready; a move's spawning, switching, draining): entering a phase ends the one
 * before it.
 */
export class PhaseSpans {
  private current: TraceSpan | null = null
  private name: string | null = null

  constructor(private readonly parent: TraceSpan) {}

  enter(name: string, attrs?: SpanAttributes): void {
    if (name === this.name) return
    this.current?.end()
    this.name = name
    this.current = this.parent.child(name, attrs)
  }

  /** end ends the phase under way (with `error`, as failed). */
  end(error?: string): void {
    this.current?.end(error)
    this.current = null
    this.name = null
  }
}
