import type { RequestTrace, SpanAttributes, TraceSpan } from '../host/telemetry/spans.ts'
import type { ForwardEnd, WireForwardAction } from '../wire/route.ts'

/**
 * A traced request's call to another process (an engine, another pod's gateway) is a client span
 * under the request's server span, and the receiver gets that span's W3C `traceparent` so its own
 * spans join the request's trace (the peer pod's front; vLLM run with --otlp-traces-endpoint). The
 * client's own `traceparent` is not forwarded beside it: the request's span is already its child.
 * Untraced requests never come here: their forwards pass the client's headers as they are.
 */
export const TRACEPARENT = 'traceparent'
const DROP_TRACEPARENT: readonly string[] = [TRACEPARENT]

/** callSpan: the client span of a request's call, begun now (before any connection is opened). */
export function callSpan(trace: RequestTrace, name: string, attrs: SpanAttributes): TraceSpan {
  return trace.child(name, attrs, { kind: 'client' })
}

/**
 * engineCall: the span of a request's call to an engine (`engine.call`): where it goes, the path
 * and the model name the engine serves, and what names the backend (`attrs`).
 */
export function engineCall(
  trace: RequestTrace,
  engine: { host: string; port: number; path: string; model: string },
  attrs: SpanAttributes,
): TraceSpan {
  // Unsampled: only its context travels on (UnsampledSpan), so no attributes are made for it.
  if (!trace.recording) return trace.child('engine.call')
  const span = callSpan(trace, 'engine.call', {
    'http.request.method': 'POST',
    'server.address': engine.host,
    'server.port': engine.port,
    'url.path': engine.path,
    'gen_ai.request.model': engine.model,
  })
  // Added, not spread into the object above: a copy of both per request for the same attributes.
  span.setAttributes(attrs)
  return span
}

/**
 * traced: forward `f` (made for this request alone, so changed in place) as a call under `span`:
 * its traceparent line first in the head, the client's dropped, and a recording span ended with the
 * response's outcome (before the lease's end runs).
 */
export function traced(span: TraceSpan, f: WireForwardAction): WireForwardAction {
  const line = `${TRACEPARENT}: ${span.inject()}\r\n`
  f.extraHead = f.extraHead ? line + f.extraHead : line
  f.dropHeaders = f.dropHeaders ? [...f.dropHeaders, TRACEPARENT] : DROP_TRACEPARENT
  if (span.recording) {
    const onEnd = f.onEnd
    f.onEnd = (info) => {
      endCall(span, info)
      onEnd(info)
    }
  }
  const retry = f.retry
  if (retry)
    f.retry = {
      // The call that never left ends as unsent; the next backend's call is its own span.
      next: (reason) => {
        const code = (reason as { code?: string }).code ?? 'upstream_unavailable'
        endCall(span, {
          status: 502,
          bytes: 0,
          durationMs: 0,
          ttftMs: null,
          streamed: false,
          aborted: false,
          error: code,
        })
        return retry.next(reason)
      },
    }
  return f
}

/**
 * endCall ends a call's span with the upstream's status; when it failed (no connection, a deadline,
 * a broken answer: the proxy's error code) or the client went away first (the call was cut), that
 * instead. A failure or a 5xx marks the span failed.
 */
export function endCall(span: TraceSpan, info: ForwardEnd): void {
  if (info.error) span.setAttributes({ 'error.type': info.error })
  else if (info.aborted) span.setAttributes({ 'modelgate.client_gone': true })
  else span.setAttributes({ 'http.response.status_code': info.status })
  span.end(info.error ?? (info.status >= 500 ? `HTTP ${info.status}` : undefined))
}
