import { hostname } from 'node:os'
import { type Attributes, ROOT_CONTEXT, type SpanContext, SpanKind, trace } from '@opentelemetry/api'
import type { Logger } from '../logger.ts'
import { type TelemetryConfig, type TracerHandle, tracesUrl } from './settings.ts'
import {
  NOOP_SPAN,
  OtelRequestTrace,
  OtelSpan,
  type RequestTrace,
  type SpanAttributes,
  type SpanBase,
  type TraceSpan,
} from './spans.ts'
import { parseTraceparent } from './traceparent.ts'

export type { TelemetryConfig }

/**
 * Telemetry: modelgate's traces over OTLP/HTTP (`telemetry:` in the YAML). Off unless
 * `telemetry.otlp_endpoint` is set; off, the OpenTelemetry SDK is never loaded, `requestSpan` is
 * one boolean check that returns null, and `operation` returns the shared no-op span.
 *
 * Two kinds of root span:
 * - `requestSpan`: the server span of an inference request, the root of its trace or, with an
 *   incoming `traceparent`, a child of the caller's span. Sampled at `sample_ratio` when the request
 *   starts a trace; a caller's sampled flag is followed.
 * - `operation`: an admin operation (load, sleep, wake, move, preset apply), always sampled, its own
 *   trace unless given a parent (a preset apply's loads, a request's wake).
 *
 * Spans leave in batches (a BatchSpanProcessor: at most 4096 queued, dropped beyond, so a dead
 * collector costs bounded memory); `shutdown` flushes what is queued, within the host's deadline.
 */

/** RequestHead: what the request path knows of a request when its span starts. */
export interface RequestHead {
  method: string
  /**
   * the route matched (`/v1/chat/completions`): low cardinality, also the span's name. A route
   * ending in an inference path (`/api/direct/{port}/v1/chat/completions`) names its operation too.
   */
  route: string
  /** the request's path (`url.path`) when it is not the route itself (a hop's `/internal/v1/…`). */
  path?: string
  /** the listener the request reached (`server.address`, `server.port`). */
  serverAddress?: string
  serverPort?: number
  /** the request's `traceparent` header, if any. */
  traceparent?: string | null
  /** the `model` the body names. */
  model?: string
  /** the client's address. */
  clientAddress?: string
}

/** GEN_AI_OPERATION: the GenAI operation of each inference route (gen_ai.operation.name). */
const GEN_AI_OPERATION: Record<string, string> = {
  '/v1/chat/completions': 'chat',
  '/v1/completions': 'text_completion',
  '/v1/embeddings': 'embeddings',
}

/** operationOf: the GenAI operation of a route, by its own path or the inference path it ends in. */
function operationOf(route: string): string | undefined {
  const exact = GEN_AI_OPERATION[route]
  if (exact !== undefined) return exact
  for (const path in GEN_AI_OPERATION) if (route.endsWith(path)) return GEN_AI_OPERATION[path]
  return undefined
}

export class Telemetry {
  /** enabled: spans are made and exported. The request path's one check. */
  readonly enabled: boolean

  /** OFF: tracing off (no SDK, no spans). */
  static readonly OFF = new Telemetry(null, '')

  private constructor(
    private readonly handle: TracerHandle | null,
    /** engineEndpoint: what engines get as --otlp-traces-endpoint ('' : nothing). */
    private readonly engineEndpoint: string,
  ) {
    this.enabled = handle !== null
  }

  /**
   * start sets tracing up from the config: with an endpoint it loads the SDK (a dynamic import, so
   * an install without tracing never pays for it) and builds the exporter; without one it is OFF
   * (engines may still get their endpoint: their traces do not need ours).
   */
  static async start(cfg: TelemetryConfig, meta: { version: string; log: Logger }): Promise<Telemetry> {
    if (!cfg.otlp_endpoint)
      return cfg.engine_otlp_traces_endpoint
        ? new Telemetry(null, cfg.engine_otlp_traces_endpoint)
        : Telemetry.OFF
    const { startTracer } = await import('./sdk.ts')
    const handle = startTracer(cfg, { version: meta.version, host: hostname(), log: meta.log })
    meta.log.info('tracing on', {
      endpoint: tracesUrl(cfg.otlp_endpoint),
      service_name: cfg.service_name,
      sample_ratio: cfg.sample_ratio,
    })
    return new Telemetry(handle, cfg.engine_otlp_traces_endpoint)
  }

  /** forTests: tracing through a given tracer (test/telemetry). */
  static withTracer(handle: TracerHandle, engineEndpoint = ''): Telemetry {
    return new Telemetry(handle, engineEndpoint)
  }

  /**
   * requestSpan starts the server span of an inference request, or returns null when tracing is off.
   * The caller ends it with the response's status (`end(status)`), and forwards `inject()` as the
   * `traceparent` of whatever it calls next (a peer pod, the engine).
   */
  requestSpan(head: RequestHead): RequestTrace | null {
    if (!this.enabled) return null
    const tracer = this.handle!.tracer
    const parent = parseTraceparent(head.traceparent)
    const ctx = parent
      ? trace.setSpanContext(ROOT_CONTEXT, {
          traceId: parent.traceId,
          spanId: parent.spanId,
          traceFlags: parent.flags,
          isRemote: true,
        } satisfies SpanContext)
      : ROOT_CONTEXT
    const attributes: SpanAttributes = {
      'http.request.method': head.method,
      'http.route': head.route,
      'url.path': head.path ?? head.route,
      'gen_ai.operation.name': operationOf(head.route),
      'gen_ai.request.model': head.model,
      'client.address': head.clientAddress,
      'server.address': head.serverAddress,
      'server.port': head.serverPort,
    }
    for (const k in attributes) if (attributes[k] === undefined) delete attributes[k]
    const span = tracer.startSpan(
      `${head.method} ${head.route}`,
      { kind: SpanKind.SERVER, attributes: attributes as Attributes },
      ctx,
    )
    return new OtelRequestTrace(tracer, span)
  }

  /**
   * operation starts the span of an admin operation (`gateway.load`, `gateway.sleep`, …): the root of
   * its own trace, or a child of `parent`. With tracing off it is NOOP_SPAN.
   */
  operation(name: string, attrs?: SpanAttributes, parent?: SpanBase | null): TraceSpan {
    if (!this.enabled) return NOOP_SPAN
    if (parent && parent !== NOOP_SPAN) return parent.child(name, attrs)
    const a: SpanAttributes = { 'modelgate.operation': name, ...attrs }
    for (const k in a) if (a[k] === undefined) delete a[k]
    const span = this.handle!.tracer.startSpan(
      name,
      { kind: SpanKind.INTERNAL, attributes: a as Record<string, string> },
      ROOT_CONTEXT,
    )
    return new OtelSpan(this.handle!.tracer, span)
  }

  /** engineTracesEndpoint: the value of vLLM's --otlp-traces-endpoint, or null when engines get none. */
  engineTracesEndpoint(): string | null {
    return this.engineEndpoint || null
  }

  /**
   * flush exports every span ended so far. A failed export rejects the SDK's flush; it is logged by
   * the exporter (sdk.ts) and is no error of the caller's, so it ends here.
   */
  async flush(): Promise<void> {
    await this.handle?.forceFlush().catch(() => {})
  }

  /** shutdown flushes what is queued and stops the exporter; the host calls it last, under its deadline. */
  async shutdown(): Promise<void> {
    await this.handle?.shutdown().catch(() => {})
  }
}
