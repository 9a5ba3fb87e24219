import { type Attributes, type Context, type Link, SpanKind } from '@opentelemetry/api'
import { type ExportResult, ExportResultCode } from '@opentelemetry/core'
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http'
import { resourceFromAttributes } from '@opentelemetry/resources'
import {
  AlwaysOnSampler,
  BasicTracerProvider,
  BatchSpanProcessor,
  ParentBasedSampler,
  type ReadableSpan,
  type Sampler,
  type SamplingResult,
  type SpanExporter,
  TraceIdRatioBasedSampler,
} from '@opentelemetry/sdk-trace-base'
import type { Logger } from '../logger.ts'
import { type TelemetryConfig, type TracerHandle, tracesUrl } from './settings.ts'

/**
 * sdk.ts is the only file that loads the OpenTelemetry SDK; telemetry.ts imports it dynamically, and
 * only when tracing is on. No global provider is registered: modelgate's spans go through the tracer
 * returned here, so nothing else in the process (a library) starts exporting on its own.
 */
export const MAX_QUEUED_SPANS = 4096

export function startTracer(
  cfg: TelemetryConfig,
  meta: { version: string; host: string; log: Logger },
): TracerHandle {
  const exporter = new ReportingExporter(
    new OTLPTraceExporter({
      url: tracesUrl(cfg.otlp_endpoint),
      headers: cfg.headers,
      timeoutMillis: cfg.export_timeout_ms,
    }),
    meta.log,
  )
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({
      'service.name': cfg.service_name,
      'service.version': meta.version,
      'host.name': meta.host,
      'process.pid': process.pid,
    }),
    sampler: new RequestsSampledSampler(cfg.sample_ratio),
    spanProcessors: [
      new BatchSpanProcessor(exporter, {
        maxQueueSize: MAX_QUEUED_SPANS,
        maxExportBatchSize: 512,
        scheduledDelayMillis: 1000,
        exportTimeoutMillis: cfg.export_timeout_ms,
      }),
    ],
  })
  return {
    tracer: provider.getTracer('modelgate', meta.version),
    forceFlush: () => provider.forceFlush(),
    shutdown: () => provider.shutdown(),
  }
}

/**
 * RequestsSampledSampler: inference requests (server spans) that start a trace are sampled at
 * `ratio`; admin operations always; a span with a parent follows the parent's sampled flag.
 */
class RequestsSampledSampler implements Sampler {
  private readonly requests: Sampler
  private readonly operations = new ParentBasedSampler({ root: new AlwaysOnSampler() })

  constructor(private readonly ratio: number) {
    this.requests = new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(ratio) })
  }

  shouldSample(
    context: Context,
    traceId: string,
    name: string,
    kind: SpanKind,
    attributes: Attributes,
    links: Link[],
  ): SamplingResult {
    const s = kind === SpanKind.SERVER ? this.requests : this.operations
    return s.shouldSample(context, traceId, name, kind, attributes, links)
  }

  toString(): string {
    return `RequestsSampled{ratio=${this.ratio}}`
  }
}

/** ReportingExporter logs a failed export (at most once a minute): the SDK's own reports go nowhere. */
class ReportingExporter implements SpanExporter {
  private lastReport = 0

  constructor(
    private readonly inner: SpanExporter,
    private readonly log: Logger,
  ) {}

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    this.inner.export(spans, (result) => {
      if (result.code !== ExportResultCode.SUCCESS && Date.now() - this.lastReport > 60_000) {
        this.lastReport = Date.now()
        this.log.warn('trace export failed; spans dropped', {
          spans: spans.length,
          error: result.error?.message ?? 'unknown',
        })
      }
      done(result)
    })
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown()
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve()
  }
}
