import { simError } from './errors.ts'
import type { GenerationRequest } from './generation.ts'
import type { InferenceRuntime } from './runtime.ts'
import { type ChatMessage, fnv1a, renderChat } from './tokenizer.ts'

/**
 * planInference validates an OpenAI chat or completion request the way vLLM does (model name,
 * context length, max_tokens) and turns it into a GenerationRequest; failures come back as vLLM's
 * error Response.
 */
export type InferenceKind = 'chat' | 'completion'

export interface InferencePlan {
  kind: InferenceKind
  id: string
  model: string
  created: number
  stream: boolean
  includeUsage: boolean
  gen: GenerationRequest
}

const CHAT_DEFAULT_MAX_TOKENS = 256
const COMPLETION_DEFAULT_MAX_TOKENS = 16

export function requestHex(): string {
  return crypto.randomUUID().replaceAll('-', '')
}

/** readJson parses a request body or returns vLLM's 400. */
export async function readJson(
  rt: InferenceRuntime,
  req: Request,
): Promise<Record<string, unknown> | Response> {
  let body: unknown
  try {
    body = await req.json()
  } catch (err) {
    return simError(rt.knobs.errorShape, 400, `Invalid JSON in request body: ${(err as Error).message}`)
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    return simError(
      rt.knobs.errorShape,
      400,
      'Input should be a valid dictionary or object to extract fields from',
    )
  }
  return body as Record<string, unknown>
}

/** checkModel returns the model name to echo, or vLLM's 404 for an unknown one. */
export function checkModel(rt: InferenceRuntime, body: Record<string, unknown>): string | Response {
  const model = body['model']
  if (model === undefined || model === null || model === '')
    return rt.args.servedModelNames[0] ?? rt.args.model
  if (typeof model === 'string' && (rt.args.servedModelNames.includes(model) || model === rt.args.model))
    return model
  return simError(rt.knobs.errorShape, 404, `The model \`${String(model)}\` does not exist.`, 'model')
}

/** promptOf renders what the tokenizer sees for a request (chat template applied for messages). */
export function promptOf(kind: InferenceKind, body: Record<string, unknown>): string | number[] | undefined {
  if (kind === 'chat') {
    const messages = body['messages']
    if (!Array.isArray(messages) || messages.length === 0) return undefined
    return renderChat(messages as ChatMessage[], body['add_generation_prompt'] !== false)
  }
  let prompt = body['prompt']
  if (Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== 'number') prompt = prompt[0]
  if (typeof prompt === 'string') return prompt
  if (Array.isArray(prompt) && prompt.every((t) => Number.isInteger(t))) return prompt as number[]
  return undefined
}

/**
 * laxBool: a flag as vLLM's request models (pydantic, lax mode) read it: true, 1 or 1.0, and the
 * strings 1, on, t, true, y, yes in any case are true; anything else is not (a real engine refuses
 * some of it with a 400, the simulator reads it as false).
 */
function laxBool(v: unknown): boolean {
  if (v === true || v === 1) return true
  return typeof v === 'string' && ['1', 'on', 't', 'true', 'y', 'yes'].includes(v.toLowerCase())
}

export function planInference(
  rt: InferenceRuntime,
  kind: InferenceKind,
  body: Record<string, unknown>,
): InferencePlan | Response {
  const style = rt.knobs.errorShape
  const model = checkModel(rt, body)
  if (model instanceof Response) return model
  const prompt = promptOf(kind, body)
  if (prompt === undefined) {
    const field = kind === 'chat' ? 'messages' : 'prompt'
    return simError(style, 400, `Field required: '${field}' must be a non-empty list or string`, field)
  }
  const promptTokens = typeof prompt === 'string' ? rt.tokenizer.encode(prompt).length : prompt.length
  const maxLen = rt.maxModelLen
  if (promptTokens >= maxLen) {
    return simError(
      style,
      400,
      `This model's maximum context length is ${maxLen} tokens. However, your request has ${promptTokens} input tokens. Please reduce the length of the input messages.`,
    )
  }
  const requested =
    kind === 'chat' ? (body['max_completion_tokens'] ?? body['max_tokens']) : body['max_tokens']
  let maxTokens: number
  if (requested === undefined || requested === null) {
    maxTokens =
      kind === 'chat'
        ? Math.min(CHAT_DEFAULT_MAX_TOKENS, maxLen - promptTokens)
        : COMPLETION_DEFAULT_MAX_TOKENS
  } else if (typeof requested !== 'number' || !Number.isInteger(requested) || requested < 1) {
    return simError(style, 400, `max_tokens must be at least 1, got ${String(requested)}.`, 'max_tokens')
  } else {
    maxTokens = requested
  }
  if (promptTokens + maxTokens > maxLen) {
    return simError(
      style,
      400,
      `'max_tokens' or 'max_completion_tokens' is too large: ${maxTokens}. This model's maximum context length is ${maxLen} tokens and your request has ${promptTokens} input tokens (${maxTokens} > ${maxLen} - ${promptTokens}).`,
      'max_tokens',
    )
  }
  const text = typeof prompt === 'string' ? prompt : prompt.join(',')
  const seed = fnv1a(text) ^ (typeof body['seed'] === 'number' ? body['seed'] : 0)
  const minTokens = typeof body['min_tokens'] === 'number' ? body['min_tokens'] : 0
  const streamOptions = body['stream_options'] as { include_usage?: unknown } | undefined
  const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${requestHex()}`
  return {
    kind,
    id,
    model,
    created: Math.floor(Date.now() / 1000),
    stream: laxBool(body['stream']),
    includeUsage: laxBool(streamOptions?.include_usage),
    gen: {
      id,
      promptTokens,
      maxTokens,
      eosAfter: Math.max(minTokens, 8 + (fnv1a(text, 0x9e3779b9) % 248)),
      ignoreEos: body['ignore_eos'] === true,
      seed,
    },
  }
}
