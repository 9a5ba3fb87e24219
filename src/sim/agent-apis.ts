import type { Server } from 'bun'
import { simError } from './errors.ts'
import type { FinishReason } from './generation.ts'
import { type InferencePlan, requestHex } from './openai-request.ts'
import { type Renderer, respondInference } from './openai-response.ts'
import type { InferenceRuntime } from './runtime.ts'
import { type ChatMessage, messageText } from './tokenizer.ts'

/**
 * The OpenAI Responses API (`POST /v1/responses`) and Anthropic's Messages API (`POST /v1/messages`)
 * as vLLM serves them: each request is turned into a chat request (vLLM's Messages handler is its
 * chat handler behind a converter; its Responses handler renders the same chat template) and planned
 * by the engine's own chat planner, so it runs through the same scheduler, KV accounting, sleep
 * checks, metrics and faults as `/v1/chat/completions`; only the rendering differs (a Renderer).
 *
 * Read from vLLM main (December 2026): `entrypoints/openai/responses/protocol.py` (ResponsesRequest,
 * ResponsesResponse.from_request, ResponseUsage), `responses/simple_streaming_events.py` (the
 * output-text events), `entrypoints/anthropic/serving.py` (messages_full_converter,
 * message_stream_converter), `anthropic/protocol.py` and `anthropic/api_router.py`.
 *
 * Responses: the body is ResponsesResponse's full `model_dump()` (every field, nulls included); a
 * stream is `event: <type>\ndata: <json>\n\n` frames numbered by `sequence_number` from 0:
 * response.created, response.in_progress, then at the first text response.output_item.added and
 * response.content_part.added, one response.output_text.delta per token, response.output_text.done,
 * response.content_part.done, response.output_item.done, and response.completed carrying the final
 * response with usage. No `[DONE]`. A request stopped by max_output_tokens is `incomplete` with
 * `incomplete_details: {reason: "max_output_tokens"}`.
 *
 * Messages: the body is AnthropicMessagesResponse dumped with `exclude_none` (so no `stop_sequence`
 * key while it is null), its id the chat completion's (`chatcmpl-…`). A stream is message_start
 * (`usage: {input_tokens: N, output_tokens: 0}`; the message lacks `type`/`role`, dumped with
 * `exclude_unset`), content_block_start at the first text, one content_block_delta (text_delta) per
 * token, content_block_stop, message_delta (`stop_reason`, usage with both input_tokens and
 * output_tokens), message_stop; no ping. Errors the handler returns are translated to
 * `{"type":"error","error":{"type": <vLLM's type, e.g. NotFoundError>, "message"}}` with the same
 * status; a body that fails request validation (no `max_tokens`, no `messages`) is vLLM's own 400
 * error shape, since that check runs before the route.
 */

/** ChatPlanner is the engine's chat planning (vLLM's or SGLang's), applied to a converted request. */
export type ChatPlanner = (
  chat: Record<string, unknown>,
) => InferencePlan | Response | Promise<InferencePlan | Response>

type Body = Record<string, unknown>

function sse(type: string, value: unknown): string {
  return `event: ${type}\ndata: ${JSON.stringify(value)}\n\n`
}

// ---------------------------------------------------------------- Responses

/** responsesMessages turns `instructions` and `input` (a string or a list of items) into chat messages. */
function responsesMessages(body: Body): ChatMessage[] | undefined {
  const input = body['input']
  const messages: ChatMessage[] = []
  if (typeof body['instructions'] === 'string')
    messages.push({ role: 'system', content: body['instructions'] })
  if (typeof input === 'string') messages.push({ role: 'user', content: input })
  else if (Array.isArray(input)) {
    for (const item of input) {
      if (!item || typeof item !== 'object') continue
      const it = item as Record<string, unknown>
      if (it['type'] !== undefined && it['type'] !== 'message') continue
      messages.push({ role: it['role'] ?? 'user', content: messageText(it['content']) })
    }
  } else return undefined
  return messages
}

interface ResponsesState {
  itemId: string
  seq: number
  text: string
  started: boolean
  instructions: string | null
}

function responseUsage(plan: InferencePlan, completion: number) {
  const input = plan.gen.promptTokens
  return {
    input_tokens: input,
    input_tokens_details: { cached_tokens: 0, input_tokens_per_turn: [], cached_tokens_per_turn: [] },
    output_tokens: completion,
    output_tokens_details: {
      reasoning_tokens: 0,
      tool_output_tokens: 0,
      output_tokens_per_turn: [],
      tool_output_tokens_per_turn: [],
    },
    total_tokens: input + completion,
  }
}

function outputText(text: string, logprobs: unknown[] | null) {
  return { annotations: [], text, type: 'output_text', logprobs }
}

function responseStatus(
  reason: FinishReason | null,
): 'completed' | 'incomplete' | 'cancelled' | 'in_progress' {
  if (reason === null) return 'in_progress'
  return reason === 'length' ? 'incomplete' : reason === 'abort' ? 'cancelled' : 'completed'
}

/** responseObject is ResponsesResponse.from_request(...).model_dump(). */
function responseObject(
  plan: InferencePlan,
  st: ResponsesState,
  reason: FinishReason | null,
  completion: number | null,
) {
  const status = responseStatus(reason)
  // No message item without text (vLLM's _make_response_output_items).
  const output =
    reason === null || st.text === ''
      ? []
      : [
          {
            id: st.itemId,
            content: [outputText(st.text, null)],
            role: 'assistant',
            status: 'completed',
            type: 'message',
          },
        ]
  return {
    id: plan.id,
    created_at: plan.created,
    incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    instructions: st.instructions,
    metadata: null,
    model: plan.model,
    object: 'response',
    output,
    parallel_tool_calls: true,
    temperature: 1.0,
    tool_choice: 'auto',
    tools: [],
    top_p: 1.0,
    background: false,
    max_output_tokens: plan.gen.maxTokens,
    max_tool_calls: null,
    previous_response_id: null,
    prompt: null,
    reasoning: null,
    service_tier: 'auto',
    status,
    text: null,
    top_logprobs: null,
    truncation: 'disabled',
    usage: completion === null ? null : responseUsage(plan, completion),
    user: null,
    input_messages: null,
    output_messages: null,
  }
}

function responsesRenderer(instructions: string | null): Renderer {
  const st: ResponsesState = { itemId: `msg_${requestHex()}`, seq: 0, text: '', started: false, instructions }
  const ev = (type: string, fields: Record<string, unknown>) =>
    sse(type, { ...fields, sequence_number: st.seq++, type })
  const ids = () => ({ item_id: st.itemId, output_index: 0 })
  const finish = (plan: InferencePlan, reason: FinishReason, completion: number): string => {
    let out = ''
    if (st.started) {
      out += ev('response.output_text.done', { content_index: 0, ...ids(), logprobs: [], text: st.text })
      out += ev('response.content_part.done', { content_index: 0, ...ids(), part: outputText(st.text, null) })
      out += ev('response.output_item.done', {
        item: {
          id: st.itemId,
          content: [outputText(st.text, null)],
          role: 'assistant',
          status: 'completed',
          type: 'message',
          annotations: [],
          logprobs: [],
        },
        output_index: 0,
      })
    }
    return out + ev('response.completed', { response: responseObject(plan, st, reason, completion) })
  }
  let reason: FinishReason = 'length'
  return {
    start: (plan) => {
      const initial = responseObject(plan, st, null, null)
      return ev('response.created', { response: initial }) + ev('response.in_progress', { response: initial })
    },
    token: (_plan, text, last) => {
      if (last) reason = last
      if (text === '') return ''
      st.text += text
      let out = ''
      if (!st.started) {
        st.started = true
        out += ev('response.output_item.added', {
          item: { id: st.itemId, content: [], role: 'assistant', status: 'in_progress', type: 'message' },
          output_index: 0,
        })
        out += ev('response.content_part.added', { content_index: 0, ...ids(), part: outputText('', []) })
      }
      return out + ev('response.output_text.delta', { content_index: 0, delta: text, ...ids(), logprobs: [] })
    },
    done: (plan, completion) => finish(plan, reason, completion),
    aborted: (plan, completion) => finish(plan, 'abort', completion),
    fail: (_rt, message) => ev('error', { code: null, message, param: null }),
    body: (plan, text, why, completion) => {
      st.text = text
      return responseObject(plan, st, why, completion)
    },
  }
}

/** serveResponses answers `POST /v1/responses` through the engine's chat planner. */
export async function serveResponses(
  rt: InferenceRuntime,
  req: Request,
  server: Server<unknown>,
  body: Body,
  planChat: ChatPlanner,
  _flavor: Flavor = 'vllm',
): Promise<Response> {
  const messages = responsesMessages(body)
  if (messages === undefined) return simError(rt.knobs.errorShape, 400, "Field required: 'input'", 'input')
  const chat: Body = { messages, stream: body['stream'] }
  if (body['model'] !== undefined) chat['model'] = body['model']
  for (const k of ['seed', 'ignore_eos', 'min_tokens'] as const) if (body[k] !== undefined) chat[k] = body[k]
  if (body['max_output_tokens'] !== undefined && body['max_output_tokens'] !== null)
    chat['max_tokens'] = body['max_output_tokens']
  const plan = await planChat(chat)
  if (plan instanceof Response) return plan
  plan.id = `resp_${requestHex()}`
  plan.gen.id = plan.id
  plan.includeUsage = true
  const instructions = typeof body['instructions'] === 'string' ? body['instructions'] : null
  return respondInference(rt, req, server, plan, responsesRenderer(instructions))
}

// ---------------------------------------------------------------- Messages

const STOP_REASONS: Partial<Record<FinishReason, string>> = { stop: 'end_turn', length: 'max_tokens' }

/** blockTexts: the texts of a list of `{type:'text', text}` blocks. */
function blockTexts(blocks: unknown[]): string[] {
  return blocks.flatMap((b) => {
    const block = b as { type?: unknown; text?: unknown } | null
    return block?.type === 'text' && typeof block.text === 'string' && block.text !== '' ? [block.text] : []
  })
}

/**
 * messagesChat is the engine's Anthropic-to-chat conversion for text content: vLLM concatenates the
 * system blocks and any system messages into one system message; SGLang joins the system blocks
 * with newlines and passes the messages on as they are.
 */
function messagesChat(body: Body, flavor: Flavor): ChatMessage[] {
  const out: ChatMessage[] = []
  const system = body['system']
  const messages = body['messages'] as ChatMessage[]
  const parts = typeof system === 'string' ? [system] : Array.isArray(system) ? blockTexts(system) : []
  if (flavor === 'sglang') {
    if (system) out.push({ role: 'system', content: parts.join('\n') })
    for (const m of messages) if (m) out.push({ role: m.role, content: messageText(m.content) })
    return out
  }
  for (const m of messages) if (m?.role === 'system') parts.push(messageText(m.content))
  if (parts.join('') !== '') out.push({ role: 'system', content: parts.join('') })
  for (const m of messages) {
    if (!m || m.role === 'system') continue
    out.push({ role: m.role, content: messageText(m.content) })
  }
  return out
}

/** anthropicError is vLLM's translate_error_response: its own error's type and message, same status. */
async function anthropicError(res: Response, flavor: Flavor): Promise<Response> {
  const json = (await res.json()) as {
    error?: { type?: string; message?: string }
    type?: string
    message?: string
  }
  const err = json.error ?? json
  if (flavor === 'sglang') {
    // SGLang's converter answers its chat checks' refusals itself, as invalid_request_error 400s.
    const server = res.status >= 500
    return Response.json(
      {
        type: 'error',
        error: { type: server ? 'internal_error' : 'invalid_request_error', message: err.message },
      },
      { status: server ? 500 : 400 },
    )
  }
  return Response.json(
    { type: 'error', error: { type: err.type, message: err.message } },
    { status: res.status },
  )
}

/**
 * Flavor: whose Messages converter is imitated. SGLang's (`entrypoints/anthropic/serving.py`) differs
 * from vLLM's: ids `msg_<hex>` (body and stream), `cache_read_input_tokens: 0` in every usage, a
 * message_start dumped with `exclude_none` (so `type` and `role`, no null stop fields) whose
 * input_tokens is 0 (its chat stream carries usage only at the end), a stop_reason that defaults to
 * end_turn, system blocks joined with newlines, and its own error types (`invalid_request_error`,
 * `internal_error`).
 */
export type Flavor = 'vllm' | 'sglang'

function messagesRenderer(flavor: Flavor): Renderer {
  let started = false
  let reason: FinishReason | null = null
  const sg = flavor === 'sglang'
  const msgId = `msg_${requestHex()}`
  const stopOf = (why: FinishReason) => STOP_REASONS[why] ?? (sg ? 'end_turn' : null)
  const usage = (plan: InferencePlan, completion: number, input = plan.gen.promptTokens) => ({
    input_tokens: input,
    output_tokens: completion,
    ...(sg ? { cache_read_input_tokens: 0 } : {}),
  })
  const end = (plan: InferencePlan, why: FinishReason, completion: number): string =>
    (started ? sse('content_block_stop', { type: 'content_block_stop', index: 0 }) : '') +
    sse('message_delta', {
      type: 'message_delta',
      delta: { stop_reason: stopOf(why) },
      usage: usage(plan, completion),
    }) +
    sse('message_stop', { type: 'message_stop' })
  return {
    start: (plan) =>
      sse('message_start', {
        type: 'message_start',
        message: sg
          ? {
              id: msgId,
              type: 'message',
              role: 'assistant',
              content: [],
              model: plan.model,
              usage: usage(plan, 0, 0),
            }
          : {
              id: plan.id,
              content: [],
              model: plan.model,
              stop_reason: null,
              stop_sequence: null,
              usage: usage(plan, 0),
            },
      }),
    token: (_plan, text, last) => {
      if (last) reason = last
      if (text === '') return ''
      let out = ''
      if (!started) {
        started = true
        out += sse('content_block_start', {
          type: 'content_block_start',
          content_block: { type: 'text', text: '' },
          index: 0,
        })
      }
      return (
        out +
        sse('content_block_delta', {
          type: 'content_block_delta',
          delta: { type: 'text_delta', text },
          index: 0,
        })
      )
    },
    done: (plan, completion) => end(plan, reason ?? 'stop', completion),
    aborted: (plan, completion) => end(plan, 'abort', completion),
    fail: (_rt, message) => sse('error', { type: 'error', error: { type: 'internal_error', message } }),
    body: (plan, text, why, completion) => {
      const stop = stopOf(why)
      return {
        id: sg ? msgId : plan.id,
        type: 'message',
        role: 'assistant',
        content: text === '' ? [] : [{ type: 'text', text }],
        model: plan.model,
        ...(stop ? { stop_reason: stop } : {}),
        usage: usage(plan, completion),
      }
    },
    failBody: (_rt, message) =>
      Response.json(
        sg
          ? { type: 'error', error: { type: 'internal_error', message: 'Internal processing error' } }
          : { type: 'error', error: { type: 'InternalServerError', message } },
        { status: 500 },
      ),
  }
}

/** serveMessages answers `POST /v1/messages` through the engine's chat planner. */
export async function serveMessages(
  rt: InferenceRuntime,
  req: Request,
  server: Server<unknown>,
  body: Body,
  planChat: ChatPlanner,
  flavor: Flavor = 'vllm',
): Promise<Response> {
  const style = rt.knobs.errorShape
  for (const field of ['model', 'messages', 'max_tokens'] as const)
    if (body[field] === undefined || body[field] === null)
      return simError(style, 400, `Field required: '${field}'`, field)
  const maxTokens = body['max_tokens']
  if (typeof maxTokens !== 'number' || !Number.isInteger(maxTokens) || maxTokens <= 0)
    return simError(style, 400, 'Value error, max_tokens must be positive', 'max_tokens')
  if (!Array.isArray(body['messages']))
    return simError(style, 400, 'Input should be a valid list', 'messages')
  const chat: Body = {
    model: body['model'],
    messages: messagesChat(body, flavor),
    max_tokens: maxTokens,
    stream: body['stream'],
  }
  const plan = await planChat(chat)
  if (plan instanceof Response) return plan.status === 500 && !plan.body ? plan : anthropicError(plan, flavor)
  plan.includeUsage = true
  return respondInference(rt, req, server, plan, messagesRenderer(flavor))
}
