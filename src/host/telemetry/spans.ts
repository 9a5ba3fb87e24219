import { attributeList, KIND, now, randomHex, type SpanAttributes, SpanRecord } from './record.ts'
import { formatTraceparent } from './traceparent.ts'
import type { Tracer } from './tracer.ts'

/**
 * The spans modelgate hands out, with parents passed explicitly (no context manager: the request
 * path is callbacks on sockets, where async context would cost on every request and follow the
 * wrong thing). A sampled span keeps a record (record.ts) that goes to the tracer's next batch when
 * it ends; an unsampled one keeps only its ids, so the context still travels on (`inject`, marked
 * not sampled) and nothing else is done. `NOOP_SPAN` stands in when tracing is off, so admin code
 * calls the same methods either way; the request path gets `null` instead.
 */
export type { SpanAttributes }

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

/** SampledBase: a recording span's methods, over its record. */
class SampledBase {
  constructor(
    protected readonly tracer: Tracer,
    protected readonly record: SpanRecord,
  ) {}

  get traceId(): string {
    return this.record.traceId
  }

  get recording(): boolean {
    return true
  }

  child(name: string, attrs?: SpanAttributes, opts?: ChildOptions): TraceSpan {
    const r = this.record
    const kind = opts?.kind === 'client' ? KIND.client : KIND.internal
    const start = opts?.startTime ?? now()
    const child = new SpanRecord(r.traceId, randomHex(8), r.spanId, name, kind, start, attributeList(attrs))
    return new SampledSpan(this.tracer, child)
  }

  event(name: string, attrs?: SpanAttributes): void {
    const e = { name, time: now(), attributes: attrs }
    if (this.record.events === null) this.record.events = [e]
    else this.record.events.push(e)
  }

  setAttributes(attrs: SpanAttributes): void {
    const r = this.record
    for (const k in attrs) r.set(k, attrs[k])
  }

  inject(): string {
    return formatTraceparent(this.record.traceId, this.record.spanId, 1)
  }

  /** finish: ends the span once (`error`: status ERROR with that message) and queues it for export. */
  protected finish(error: string | undefined): void {
    const r = this.record
    if (r.end !== 0) return
    if (error !== undefined) {
      r.status = 2
      r.statusMessage = error
    }
    r.end = now()
    this.tracer.ended(r)
  }
}

export class SampledSpan extends SampledBase implements TraceSpan {
  end(error?: string): void {
    this.finish(error)
  }
}

export class SampledRequest extends SampledBase implements RequestTrace {
  private sawFirstToken = false

  firstToken(): void {
    if (this.sawFirstToken) return
    this.sawFirstToken = true
    const r = this.record
    const at = now()
    r.set('gen_ai.server.time_to_first_token', (at - r.start) / 1000)
    const e = { name: 'gen_ai.first_token', time: at, attributes: undefined }
    if (r.events === null) r.events = [e]
    else r.events.push(e)
  }

  usage(u: { inputTokens?: number; outputTokens?: number; finishReasons?: string[] }): void {
    const r = this.record
    r.set('gen_ai.usage.input_tokens', u.inputTokens)
    r.set('gen_ai.usage.output_tokens', u.outputTokens)
    r.set('gen_ai.response.finish_reasons', u.finishReasons)
  }

  end(status: number, error?: string): void {
    const r = this.record
    if (r.end !== 0) return
    r.set('http.response.status_code', status)
    // Server spans: 4xx is the client's doing, not an error of this service (OTel HTTP conventions).
    if (error === undefined && status >= 500) error = `HTTP ${status}`
    if (error !== undefined) r.set('error.type', String(status))
    this.finish(error)
  }
}

/**
 * UnsampledSpan: a span of a trace that is not kept: its ids only, so that what it calls still gets
 * the trace, marked not sampled; every other call does nothing. Its children are itself: no span
 * of the trace is recorded here, so the receiver's parent id may as well be this one, and an
 * unsampled request (most of them, at the ratios operators run) makes no more ids or objects.
 */
export class UnsampledSpan implements TraceSpan, RequestTrace {
  constructor(
    readonly traceId: string,
    private readonly spanId: string,
  ) {}

  get recording(): boolean {
    return false
  }

  child(): TraceSpan {
    return this
  }

  inject(): string {
    return formatTraceparent(this.traceId, this.spanId, 0)
  }

  event(): void {}
  setAttributes(): void {}
  firstToken(): void {}
  usage(): void {}
  end(): void {}
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
