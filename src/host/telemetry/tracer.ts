import type { Logger } from '../logger.ts'
import { OtlpJsonEncoder, sendOtlp } from './otlp-json.ts'
import type { SpanRecord } from './record.ts'
import { type TelemetryConfig, tracesUrl } from './settings.ts'

/**
 * Tracer batches the spans that ended and sends them to the collector, as OpenTelemetry's
 * BatchSpanProcessor does with its defaults: a batch of up to BATCH_SIZE spans leaves as soon as
 * that many wait, else BATCH_DELAY_MS after the first; one export at a time, each within
 * `export_timeout_ms`; at most MAX_QUEUED_SPANS wait, and beyond that new spans are dropped, so a
 * dead collector costs bounded memory. A failed export drops its batch and is logged (at most once
 * a minute). A batch is encoded on a timer, never inside the call that ended a span (a request's).
 *
 * It stands where the OpenTelemetry SDK stood: with every request traced, the SDK cost the proxy
 * several times its own work per request (objects per span, attribute and event, again per export,
 * then Node's http module; test/perf/README.md). Here a span is one record until its batch is
 * written as text (otlp-json.ts) and sent with fetch.
 */
export const MAX_QUEUED_SPANS = 4096
export const BATCH_SIZE = 512
export const BATCH_DELAY_MS = 1000
/** How often a failing collector is reported. */
const REPORT_EVERY_MS = 60_000

export class Tracer {
  private queue: SpanRecord[] = []
  private timer: Timer | null = null
  /** due: the timer set fires at once (a full batch waits); spans ending meanwhile leave it as it is. */
  private due = false
  private exporting: Promise<void> | null = null
  private closed = false
  private lastReport = 0
  private readonly encoder: OtlpJsonEncoder
  private readonly url: string
  private readonly log: Logger
  /** dropped: spans not sent (the queue was full, their export failed, or they ended after shutdown). */
  dropped = 0

  constructor(
    private readonly cfg: TelemetryConfig,
    meta: { version: string; host: string; log: Logger },
  ) {
    this.url = tracesUrl(cfg.otlp_endpoint)
    this.log = meta.log
    this.encoder = new OtlpJsonEncoder(
      {
        'service.name': cfg.service_name,
        'service.version': meta.version,
        'host.name': meta.host,
        'process.pid': process.pid,
      },
      { name: 'modelgate', version: meta.version },
    )
  }

  /** ended: a sampled span ended; it goes with the next batch. */
  ended(span: SpanRecord): void {
    if (this.closed || this.queue.length >= MAX_QUEUED_SPANS) {
      this.dropped++
      return
    }
    this.queue.push(span)
    if (this.exporting !== null || this.due) return
    if (this.queue.length >= BATCH_SIZE) this.schedule(0)
    else if (this.timer === null) this.schedule(BATCH_DELAY_MS)
  }

  private schedule(ms: number): void {
    if (this.timer !== null) clearTimeout(this.timer)
    this.due = ms === 0
    this.timer = setTimeout(() => {
      this.timer = null
      this.due = false
      if (this.exporting === null) this.exportBatch()
    }, ms)
    this.timer.unref()
  }

  /** exportBatch sends the next batch; once it is done, the one after is scheduled. */
  private exportBatch(): Promise<void> {
    const batch = this.queue.length <= BATCH_SIZE ? this.queue : this.queue.slice(0, BATCH_SIZE)
    this.queue = batch === this.queue ? [] : this.queue.slice(BATCH_SIZE)
    const sent = this.send(batch).finally(() => {
      this.exporting = null
      if (this.closed) return
      if (this.queue.length >= BATCH_SIZE) this.schedule(0)
      else if (this.queue.length > 0 && this.timer === null) this.schedule(BATCH_DELAY_MS)
    })
    this.exporting = sent
    return sent
  }

  private async send(batch: SpanRecord[]): Promise<void> {
    if (batch.length === 0) return
    try {
      await sendOtlp(this.url, this.cfg.headers, this.encoder.encode(batch), this.cfg.export_timeout_ms)
    } catch (err) {
      this.dropped += batch.length
      if (Date.now() - this.lastReport < REPORT_EVERY_MS) return
      this.lastReport = Date.now()
      this.log.warn('trace export failed; spans dropped', {
        spans: batch.length,
        error: err instanceof Error ? err.message : String(err),
      })
    }
  }

  /** flush sends every span queued now, after the export under way. */
  async flush(): Promise<void> {
    if (this.timer !== null) {
      clearTimeout(this.timer)
      this.timer = null
      this.due = false
    }
    // Spans ending meanwhile go too, within a bound: a busy server does not keep a flush going.
    let rounds = Math.ceil(this.queue.length / BATCH_SIZE) + 1
    while (rounds-- > 0 && (this.exporting !== null || this.queue.length > 0))
      await (this.exporting ?? this.exportBatch())
  }

  /** shutdown flushes, then drops whatever ends after it. */
  async shutdown(): Promise<void> {
    await this.flush()
    this.closed = true
    if (this.timer !== null) clearTimeout(this.timer)
    this.timer = null
    this.due = false
  }
}
