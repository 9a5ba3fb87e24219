import { sseMessages } from '../../../../src/dashboard/client/sse.ts'
import { ApiError, errorFrom } from './api.ts'

/**
 * streamChat sends one streamed chat completion through the gateway's `/v1` (the inference key, not
 * the JWT: the two stay apart) and reports the text as it arrives with the timings the
 * benchmarks use: time to first token (request sent → first content), and tokens per second over
 * the generation after it (output tokens ÷ (end − first token)).
 */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant'
  content: string
}

export interface ChatStats {
  ttftMs: number | null
  tokens: number
  tokensPerSecond: number | null
  finishReason: string | null
}

export interface ChatRequest {
  key: string | null
  model: string
  messages: ChatMessage[]
  temperature?: number
  maxTokens?: number
  signal: AbortSignal
  onText(delta: string, stats: ChatStats): void
}

interface Chunk {
  choices?: { delta?: { content?: string | null }; finish_reason?: string | null }[]
  usage?: { completion_tokens?: number } | null
  error?: { message?: string; code?: string }
}

export async function streamChat(r: ChatRequest): Promise<ChatStats> {
  const sent = performance.now()
  const res = await fetch('/v1/chat/completions', {
    method: 'POST',
    signal: r.signal,
    headers: { 'content-type': 'application/json', ...(r.key ? { authorization: `Bearer ${r.key}` } : {}) },
    body: JSON.stringify({
      model: r.model,
      messages: r.messages,
      stream: true,
      stream_options: { include_usage: true },
      ...(r.temperature === undefined ? {} : { temperature: r.temperature }),
      ...(r.maxTokens === undefined ? {} : { max_tokens: r.maxTokens }),
    }),
  })
  if (!res.ok || !res.body) throw await errorFrom(res)
  const stats: ChatStats = { ttftMs: null, tokens: 0, tokensPerSecond: null, finishReason: null }
  let first = 0
  let chunks = 0
  let usageTokens: number | null = null
  const rate = (now: number, tokens: number) =>
    now > first && tokens > 0 ? (tokens / (now - first)) * 1000 : null
  for await (const m of sseMessages(res.body)) {
    if (m.data === '[DONE]') break
    const chunk = JSON.parse(m.data) as Chunk
    if (chunk.error)
      throw new ApiError(502, chunk.error.code ?? 'STREAM_ERROR', chunk.error.message ?? 'stream error')
    if (chunk.usage?.completion_tokens !== undefined) usageTokens = chunk.usage.completion_tokens
    const choice = chunk.choices?.[0]
    if (choice?.finish_reason) stats.finishReason = choice.finish_reason
    const text = choice?.delta?.content
    if (!text) continue
    const now = performance.now()
    if (stats.ttftMs === null) {
      first = now
      stats.ttftMs = now - sent
    }
    chunks++
    stats.tokens = chunks
    stats.tokensPerSecond = rate(now, chunks)
    r.onText(text, { ...stats })
  }
  const end = performance.now()
  stats.tokens = usageTokens ?? chunks
  stats.tokensPerSecond = rate(end, stats.tokens) ?? stats.tokensPerSecond
  return stats
}
