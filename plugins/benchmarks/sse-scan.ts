/**
 * SseScanner turns the body bytes of an OpenAI-style streaming completion into timing facts without
 * JSON-parsing every chunk: each `data:` line is classified with a few `indexOf`/regex probes
 * (content, usage, error, `[DONE]`), and only the rare usage and error lines are parsed. It exists
 * so the benchmark runner can keep up with thousands of token streams without becoming the
 * bottleneck it measures.
 *
 * Text is handled as latin1 (one char per byte): the probes look for ASCII only, and the few lines
 * that are parsed are re-decoded as UTF-8.
 */
export interface SseSink {
  /** content: a chunk carrying generated text (non-empty `text`, `delta.content` or reasoning). */
  content(at: number): void
  usage(promptTokens: number | null, completionTokens: number | null): void
  error(message: string): void
  done(): void
}

const CONTENT_RE = /"(?:text|content|reasoning_content|reasoning)"\s*:\s*"(?!")/g
const USAGE_RE = /"usage"\s*:\s*\{/
const ERROR_RE = /"error"\s*:/

function utf8(latin1: string): string {
  return Buffer.from(latin1, 'latin1').toString('utf8')
}

/** classifyData handles one `data:` payload (without the `data:` prefix). */
export function classifyData(payload: string, at: number, sink: SseSink): void {
  if (payload.charCodeAt(0) === 91 /* [ */ && payload.startsWith('[DONE]')) {
    sink.done()
    return
  }
  const choices = payload.indexOf('"choices"')
  if (choices >= 0) {
    // a global regex searched from lastIndex: no substring per chunk
    CONTENT_RE.lastIndex = choices
    if (CONTENT_RE.test(payload)) sink.content(at)
  }
  if (payload.indexOf('"usage"') >= 0 && USAGE_RE.test(payload)) {
    try {
      const usage = (
        JSON.parse(utf8(payload)) as { usage?: { prompt_tokens?: unknown; completion_tokens?: unknown } }
      ).usage
      const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : null)
      sink.usage(num(usage?.prompt_tokens), num(usage?.completion_tokens))
    } catch {
      // a malformed usage line leaves counts to the content-chunk fallback
    }
    return
  }
  if (choices < 0 && ERROR_RE.test(payload)) sink.error(errorMessage(payload))
}

/** errorMessage extracts `error.message` (OpenAI and vLLM shapes) from a JSON text, or returns it trimmed. */
export function errorMessage(text: string): string {
  try {
    const body = JSON.parse(utf8(text)) as {
      error?: { message?: unknown; code?: unknown } | string
      message?: unknown
    }
    if (typeof body.error === 'string') return body.error
    // the OpenAI error code (`invalid_api_key`, `rate_limit_exceeded`) says more than its message alone
    if (body.error && typeof body.error.message === 'string')
      return typeof body.error.code === 'string' && body.error.code
        ? `${body.error.code}: ${body.error.message}`
        : body.error.message
    if (typeof body.message === 'string') return body.message
  } catch {
    // not JSON
  }
  return utf8(text).trim().slice(0, 300) || 'empty error body'
}

/** SseLineReader assembles `data:` lines across arbitrary read boundaries. */
export class SseLineReader {
  private rest = ''

  constructor(private readonly sink: SseSink) {}

  /** push feeds latin1 text received at time `at`. */
  push(text: string, at: number): void {
    const buf = this.rest === '' ? text : this.rest + text
    let start = 0
    for (;;) {
      const nl = buf.indexOf('\n', start)
      if (nl < 0) break
      let end = nl
      if (end > start && buf.charCodeAt(end - 1) === 13) end--
      // biome-ignore format: keep the probe compact
      if (end - start > 5 && buf.charCodeAt(start) === 100 /* d */ && buf.startsWith('data:', start)) {
        let from = start + 5
        if (buf.charCodeAt(from) === 32) from++
        classifyData(buf.slice(from, end), at, this.sink)
      }
      start = nl + 1
    }
    this.rest = start === 0 ? buf : buf.slice(start)
  }

  /** finish handles a last line that arrived without a newline. */
  finish(at: number): void {
    if (this.rest.startsWith('data:')) classifyData(this.rest.slice(5).trimStart(), at, this.sink)
    this.rest = ''
  }
}
