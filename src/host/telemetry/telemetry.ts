import { hostname } from 'node:os'
import type { Logger } from '../logger.ts'
import {
  type AttributeList,
  attributeList,
  KIND,
  now,
  randomHex,
  SpanRecord,
  sampledByRatio,
} from './record.ts'
import { type TelemetryConfig, tracesUrl } from './settings.ts'
import {
  NOOP_SPAN,
  type RequestTrace,
  SampledRequest,
  SampledSpan,
  type SpanAttributes,
  type SpanBase,
  type TraceSpan,
  UnsampledSpan,
} from './spans.ts'
import { parseTraceparent } from './traceparent.ts'
import { Tracer } from './tracer.ts'

export type { TelemetryConfig }

/**
 * Telemetry: modelgate's traces over OTLP/HTTP (`telemetry:` in the YAML). Off unless
 * `telemetry.otlp_endpoint` is set; off, no tracer exists, `requestSpan` is one boolean check that
 * returns null, and `operation` returns the shared no-op span.
 *
 * Two kinds of root span:
 * - `requestSpan`: the server span of an inference request, the root of its trace or, with an
 *   incoming `traceparent`, a child of the caller's span. Sampled at `sample_ratio` when the request
 *   starts a trace; a caller's sampled flag is followed.
 * - `operation`: an admin operation (load, sleep, wake, move, preset apply), always sampled, its own
 *   trace unless given a parent (a preset apply's loads, a request's wake).
 *
 * Spans leave in batches (tracer.ts: at most 4096 queued, dropped beyond, so a dead
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
  /**
   * the Host header the client sent: when given, `server.*` are the host and port it names (the
   * listener's port when it names none). Read only for a sampled span.
   */
  host?: string | null
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

/** OPERATIONS: each route's operation (null: none) once worked out (routes are a few dozen, bounded anyway). */
const OPERATIONS = new Map<string, string | null>()

/** operationOf: the GenAI operation of a route, by its own path or the inference path it ends in. */
function operationOf(route: string): string | undefined {
  let op = OPERATIONS.get(route)
  if (op === undefined) {
    op = GEN_AI_OPERATION[route] ?? null
    if (op === null)
      for (const path in GEN_AI_OPERATION)
        if (route.endsWith(path)) {
          op = GEN_AI_OPERATION[path]!
          break
        }
    if (OPERATIONS.size < 256) OPERATIONS.set(route, op)
  }
  return op ?? undefined
}

export class Telemetry {
  /** enabled: spans are made and exported. The request path's one check. */
  readonly enabled: boolean

  /** OFF: tracing off (no tracer, no spans). */
  static readonly OFF = new Telemetry(null, '', 0)

  private constructor(
    private readonly tracer: Tracer | null,
    /** engineEndpoint: what engines get as --otlp-traces-endpoint ('' : nothing). */
    private readonly engineEndpoint: string,
    /** sampleRatio: telemetry.sample_ratio, of the requests that start a trace. */
    private readonly sampleRatio: number,
  ) {
    this.enabled = tracer !== null
  }

  /**
   * start sets tracing up from the config: with an endpoint, a tracer that batches spans to it;
   * without one it is OFF (engines may still get their endpoint: their traces do not need ours).
   */
  static async start(cfg: TelemetryConfig, meta: { version: string; log: Logger }): Promise<Telemetry> {
    if (!cfg.otlp_endpoint)
      return cfg.engine_otlp_traces_endpoint
        ? new Telemetry(null, cfg.engine_otlp_traces_endpoint, 0)
        : Telemetry.OFF
    const tracer = new Tracer(cfg, { version: meta.version, host: hostname(), log: meta.log })
    meta.log.info('tracing on', {
      endpoint: tracesUrl(cfg.otlp_endpoint),
      service_name: cfg.service_name,
      sample_ratio: cfg.sample_ratio,
    })
    return new Telemetry(tracer, cfg.engine_otlp_traces_endpoint, cfg.sample_ratio)
  }

  /**
   * requestSpan starts the server span of an inference request, or returns null when tracing is off.
   * The caller ends it with the response's status (`end(status)`), and forwards `inject()` as the
   * `traceparent` of whatever it calls next (a peer pod, the engine).
   */
  requestSpan(head: RequestHead): RequestTrace | null {
    if (!this.enabled) return null
    const parent = parseTraceparent(head.traceparent)
    const traceId = parent ? parent.traceId : randomHex(16)
    const sampled = parent ? (parent.flags & 1) === 1 : sampledByRatio(traceId, this.sampleRatio)
    if (!sampled) return new UnsampledSpan(traceId, randomHex(8))
    const attributes: AttributeList = [
      'http.request.method',
      head.method,
      'http.route',
      head.route,
      'url.path',
      head.path ?? head.route,
    ]
    const operation = operationOf(head.route)
    if (operation !== undefined) attributes.push('gen_ai.operation.name', operation)
    if (head.model !== undefined) attributes.push('gen_ai.request.model', capped(head.model))
    if (head.clientAddress !== undefined) attributes.push('client.address', head.clientAddress)
    let serverAddress = head.serverAddress
    let serverPort = head.serverPort
    const host = head.host
    if (host) {
      const colon = host.lastIndexOf(':')
      if (colon > host.lastIndexOf(']')) {
        serverAddress = host.slice(0, colon)
        serverPort = Number(host.slice(colon + 1)) || serverPort
      } else serverAddress = host
    }
    if (serverAddress !== undefined) attributes.push('server.address', serverAddress)
    if (serverPort !== undefined) attributes.push('server.port', serverPort)
    const name = `${head.method} ${head.route}`
    const record = new SpanRecord(
      traceId,
      randomHex(8),
      parent?.spanId ?? '',
      name,
      KIND.server,
      now(),
      attributes,
    )
    return new SampledRequest(this.tracer!, record)
  }

  /**
   * operation starts the span of an admin operation (`gateway.load`, `gateway.sleep`, …): the root of
   * its own trace, or a child of `parent`. With tracing off it is NOOP_SPAN.
   */
  operation(name: string, attrs?: SpanAttributes, parent?: SpanBase | null): TraceSpan {
    if (!this.enabled) return NOOP_SPAN
    if (parent && parent !== NOOP_SPAN) return parent.child(name, attrs)
    const a = attributeList(attrs, ['modelgate.operation', name])
    const record = new SpanRecord(randomHex(16), randomHex(8), '', name, KIND.internal, now(), a)
    return new SampledSpan(this.tracer!, record)
  }

  /** engineTracesEndpoint: the value of vLLM's --otlp-traces-endpoint, or null when engines get none. */
  engineTracesEndpoint(): string | null {
    return this.engineEndpoint || null
  }

  /** flush exports every span ended so far (a failed export is the tracer's to log, never the caller's). */
  async flush(): Promise<void> {
    await this.tracer?.flush()
  }

  /** shutdown flushes what is queued and stops exporting; the host calls it last, under its deadline. */
  async shutdown(): Promise<void> {
    await this.tracer?.shutdown()
  }
}

/**
 * The longest client string a span carries as an attribute: a `model` is whatever a client sent (a
 * 1 MB name included), and a span is exported and kept by a tracing backend.
 */
const MAX_CLIENT_CHARS = 256

/** capped: a client's string as a span attribute, cut to MAX_CLIENT_CHARS (and an ellipsis). */
export function capped(s: string): string {
  return s.length <= MAX_CLIENT_CHARS ? s : `${s.slice(0, MAX_CLIENT_CHARS)}…`
}
