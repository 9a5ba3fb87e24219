import type { RequestTrace } from '../host/telemetry/spans.ts'
import type { Telemetry } from '../host/telemetry/telemetry.ts'
import type { InternalHead, InternalRequest } from '../http/auth.ts'
import { BodyRange } from './body-range.ts'
import type { ScanFailure, ScannedJson } from './json-scan.ts'
import { header, nameAt, type ParsedRequest, type RequestHead } from './request-parser.ts'
import type { InferenceGrant, WireRequest } from './route.ts'

/**
 * The request objects the wire front hands out: to a hot route (ParsedWireRequest, the route.ts
 * contract) and to the listener's internal check (internalHead, internalRequest), each a view of
 * the one parsed head.
 */

/** SpanSource: what a request asks its connection (ClientConn) for when its route starts a trace. */
export interface SpanSource {
  readonly tracing: Telemetry | null
  requestSpan(head: RequestHead, route: string, model: string | undefined): RequestTrace | null
}

/**
 * ParsedWireRequest: a hot route's request, made when its head is complete (what admission sees)
 * and completed with its body.
 */
export class ParsedWireRequest implements WireRequest {
  private scanned: ScannedJson | ScanFailure | undefined = undefined
  body: BodyRange = BodyRange.EMPTY
  startedAt = 0
  grant: InferenceGrant | null = null
  trace: RequestTrace | null = null

  constructor(
    /** The request's head (the front's own view; a retried forward is carried out again from it). */
    readonly head: RequestHead,
    private readonly maxJsonDepth: number,
    private readonly conn: SpanSource,
  ) {}

  json(): ScannedJson | ScanFailure {
    this.scanned ??= this.body.scanJson(this.maxJsonDepth)
    return this.scanned
  }

  startTrace(route: string, model?: string): RequestTrace | null {
    if (this.conn.tracing === null) return null
    this.trace ??= this.conn.requestSpan(this.head, route, model)
    return this.trace
  }

  get method(): string {
    return this.head.method
  }

  get path(): string {
    return this.head.path
  }

  get query(): string {
    return this.head.query
  }

  header(name: string): string | null {
    return header(this.head, name)
  }
}

/** internalHead: what the internal check can judge from the head (internalRequest without the body). */
export function internalHead(head: RequestHead, peer: string): InternalHead {
  return {
    method: head.method,
    target: head.target,
    headers: { get: (name) => joinedHeader(head, name) },
    peer,
  }
}

/**
 * internalRequest: what the internal check reads. `target` is the target relayed (the one parse);
 * a header sent more than once reads as its values joined by ", ", as the framework behind reads it.
 */
export function internalRequest(r: ParsedRequest, peer: string): InternalRequest {
  const head = r.head
  return {
    method: head.method,
    target: head.target,
    headers: { get: (name) => joinedHeader(head, name) },
    body: r.body.bytes(),
    peer,
  }
}

/** joinedHeader: every value of the lower-case header `name`, joined by ", " (null when absent). */
function joinedHeader(head: RequestHead, name: string): string | null {
  const f = head.fields
  let out: string | null = null
  for (let k = 0; k < f.length; k += 4)
    if (f[k + 1]! - f[k]! === name.length && nameAt(head.text, f[k]!, name)) {
      const value = head.text.slice(f[k + 2]!, f[k + 3]!)
      out = out === null ? value : `${out}, ${value}`
    }
  return out
}
