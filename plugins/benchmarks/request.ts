import type { HttpStreamClient, StreamCallbacks } from './http-stream.ts'
import { SseLineReader, type SseSink } from './sse-scan.ts'

/**
 * RequestSample is what one streamed completion measured, in `performance.now()` milliseconds.
 * Times follow `vllm bench serve`: TTFT is the arrival of the first chunk carrying generated
 * content minus the send time; E2E is the arrival of the last such chunk minus the send time.
 */
export interface RequestSample {
  ok: boolean
  error: string | null
  /** status: the response's HTTP status; 0 when no response head arrived (refused, broken, timed out). */
  status: number
  /** cancelled: cut short by the run's cancellation; neither a success nor a failure. */
  cancelled: boolean
  sendAt: number
  endAt: number
  /** ttftMs and e2eMs are NaN when no content arrived. */
  ttftMs: number
  e2eMs: number
  /** outputTokens: `usage.completion_tokens`, else the number of content chunks. */
  outputTokens: number
  promptTokens: number | null
  usageReported: boolean
  contentChunks: number
  /** itlGaps: gaps between content chunks (ms), measured requests only. */
  itlGaps?: number[]
}

class StreamingRequest implements SseSink, StreamCallbacks {
  private first = -1
  private last = -1
  private chunks = 0
  private promptTokens: number | null = null
  private completionTokens: number | null = null
  private streamError: string | null = null
  private readonly reader: SseLineReader
  cancelled = false
  /** gaps between content chunks, kept per request and counted only if the request succeeds. */
  private readonly gaps: number[] | null

  constructor(
    readonly sendAt: number,
    collectItl: boolean,
    private readonly resolve: (s: RequestSample) => void,
  ) {
    this.reader = new SseLineReader(this)
    this.gaps = collectItl ? [] : null
  }

  content(at: number): void {
    if (this.first < 0) this.first = at
    else this.gaps?.push(at - this.last)
    this.last = at
    this.chunks++
  }

  usage(promptTokens: number | null, completionTokens: number | null): void {
    if (promptTokens !== null) this.promptTokens = promptTokens
    if (completionTokens !== null) this.completionTokens = completionTokens
  }

  error(message: string): void {
    this.streamError ??= message
  }

  done(): void {}

  body(text: string, at: number): void {
    this.reader.push(text, at)
  }

  end(status: number, errorText: string | null, at: number): void {
    this.reader.finish(at)
    let error = errorText ?? this.streamError
    if (error && status >= 400) error = `HTTP ${status}: ${error}`
    if (!error && this.first < 0) error = 'the stream carried no generated content'
    const usageReported = this.completionTokens !== null
    this.resolve({
      ok: error === null && !this.cancelled,
      error: this.cancelled ? 'cancelled' : error,
      status,
      cancelled: this.cancelled,
      sendAt: this.sendAt,
      endAt: at,
      ttftMs: this.first < 0 ? Number.NaN : this.first - this.sendAt,
      e2eMs: this.last < 0 ? Number.NaN : this.last - this.sendAt,
      outputTokens: usageReported ? this.completionTokens! : this.chunks,
      promptTokens: this.promptTokens,
      usageReported,
      contentChunks: this.chunks,
      ...(this.gaps ? { itlGaps: this.gaps } : {}),
    })
  }
}

export interface InFlight {
  readonly sendAt: number
  readonly done: Promise<RequestSample>
  /** abort ends the request; `cancelled` marks it as cut by cancellation rather than failed. */
  abort(reason: string, cancelled: boolean): void
}

/** sendStreamingRequest posts a pre-encoded request and measures its stream. */
export function sendStreamingRequest(
  client: HttpStreamClient,
  url: URL,
  payload: Uint8Array,
  collectItl: boolean,
): InFlight {
  let req!: StreamingRequest
  let abortFn: (reason: string) => void = () => {}
  const sendAt = performance.now()
  const done = new Promise<RequestSample>((resolve) => {
    req = new StreamingRequest(sendAt, collectItl, resolve)
    abortFn = client.request(url, payload, req)
  })
  return {
    sendAt,
    done,
    abort(reason, cancelled) {
      if (cancelled) req.cancelled = true
      abortFn(reason)
    },
  }
}
