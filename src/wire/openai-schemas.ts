import { Type as t } from '@sinclair/typebox'

/**
 * Request and response shapes of the OpenAI-compatible inference routes, for /docs. Requests stay
 * open (`additionalProperties`): engines accept many extra sampling parameters (top_k, min_tokens,
 * ignore_eos, stream_options, …) and the proxy forwards the body bytes unchanged anyway. Shared by
 * every plugin that proxies inference (gateway, router).
 */
const open = { additionalProperties: true }

const Usage = t.Object(
  { prompt_tokens: t.Integer(), completion_tokens: t.Integer(), total_tokens: t.Integer() },
  open,
)

const ModelField = t.String({
  description: 'instance id, served model name or model path of a loaded model',
  examples: ['facebook/opt-125m'],
})

export const ChatCompletionRequest = t.Object(
  {
    model: ModelField,
    messages: t.Array(
      t.Object(
        {
          role: t.String({ examples: ['system', 'user', 'assistant'] }),
          content: t.Union([t.String(), t.Array(t.Unknown()), t.Null()]),
        },
        open,
      ),
      { minItems: 1 },
    ),
    temperature: t.Optional(t.Number()),
    max_tokens: t.Optional(t.Integer()),
    stream: t.Optional(
      t.Boolean({ description: 'true: the reply is an SSE stream of chat.completion.chunk' }),
    ),
  },
  { ...open, description: 'Chat completion request (extra engine sampling parameters are passed on)' },
)

export const ChatCompletion = t.Object(
  {
    id: t.String(),
    object: t.Literal('chat.completion'),
    created: t.Integer({ description: 'Unix seconds' }),
    model: t.String(),
    choices: t.Array(
      t.Object(
        {
          index: t.Integer(),
          message: t.Object({ role: t.String(), content: t.Union([t.String(), t.Null()]) }, open),
          finish_reason: t.Union([t.String(), t.Null()]),
        },
        open,
      ),
    ),
    usage: Usage,
  },
  {
    ...open,
    description:
      'With stream false. With stream true the reply is `text/event-stream`: lines `data: <chat.completion.chunk>` ' +
      '(choices[].delta {role?, content?}, finish_reason null until the end) ending with `data: [DONE]`. ' +
      'If the engine fails mid-stream the last event is `data: {"error": {message, type, code}}` then `data: [DONE]`.',
  },
)

export const CompletionRequest = t.Object(
  {
    model: ModelField,
    prompt: t.Union([t.String(), t.Array(t.String()), t.Array(t.Integer()), t.Array(t.Array(t.Integer()))]),
    max_tokens: t.Optional(t.Integer()),
    temperature: t.Optional(t.Number()),
    stream: t.Optional(t.Boolean()),
  },
  { ...open, description: 'Text completion request' },
)

export const Completion = t.Object(
  {
    id: t.String(),
    object: t.Literal('text_completion'),
    created: t.Integer(),
    model: t.String(),
    choices: t.Array(
      t.Object(
        { text: t.String(), index: t.Integer(), finish_reason: t.Union([t.String(), t.Null()]) },
        open,
      ),
    ),
    usage: Usage,
  },
  { ...open, description: 'With stream false; with stream true an SSE stream of text_completion chunks' },
)

export const ModelList = t.Object({
  object: t.Literal('list'),
  data: t.Array(
    t.Object(
      {
        id: t.String({ description: 'served model name, or instance id' }),
        object: t.Literal('model'),
        created: t.Integer(),
        owned_by: t.String(),
        root: t.String({ description: 'model path' }),
        max_model_len: t.Union([t.Integer(), t.Null()]),
        instance_id: t.String(),
      },
      open,
    ),
  ),
})

/** EngineRequest: the pooling-model and tokenizer routes; `model` is required by the proxy. */
export const EngineRequest = (description: string) =>
  t.Object({ model: ModelField }, { ...open, description })

export const EngineResponse = (description: string) => t.Record(t.String(), t.Unknown(), { description })

export const TokenizeRequest = t.Object(
  {
    model: ModelField,
    prompt: t.Optional(t.String()),
    messages: t.Optional(t.Array(t.Object({ role: t.String(), content: t.Unknown() }, open))),
  },
  { ...open, description: 'Either prompt or messages' },
)

export const TokenizeResponse = t.Object(
  { count: t.Integer(), max_model_len: t.Integer(), tokens: t.Array(t.Integer()) },
  open,
)

export const DetokenizeRequest = t.Object({ model: ModelField, tokens: t.Array(t.Integer()) }, open)
export const DetokenizeResponse = t.Object({ prompt: t.String() }, open)

export const ResponsesRequest = t.Object(
  {
    model: ModelField,
    input: t.Union([t.String(), t.Array(t.Unknown())], {
      description: 'the prompt: text, or a list of input items (messages)',
    }),
    instructions: t.Optional(t.String()),
    max_output_tokens: t.Optional(t.Integer()),
    stream: t.Optional(t.Boolean({ description: 'true: the reply is an SSE stream of response.* events' })),
  },
  { ...open, description: 'OpenAI Responses API request (the engine serves it; fields are passed on)' },
)

export const ResponseObject = t.Object(
  {
    id: t.String(),
    object: t.Literal('response'),
    model: t.String(),
    status: t.String(),
    output: t.Array(t.Unknown()),
    usage: t.Object(
      { input_tokens: t.Integer(), output_tokens: t.Integer(), total_tokens: t.Integer() },
      open,
    ),
  },
  open,
)

export const MessagesRequest = t.Object(
  {
    model: ModelField,
    messages: t.Array(
      t.Object({ role: t.String({ examples: ['user', 'assistant'] }), content: t.Unknown() }, open),
    ),
    max_tokens: t.Integer(),
    system: t.Optional(t.Union([t.String(), t.Array(t.Unknown())])),
    stream: t.Optional(
      t.Boolean({ description: 'true: the reply is an SSE stream of message_start … message_stop events' }),
    ),
  },
  { ...open, description: 'Anthropic Messages API request (the engine serves it; fields are passed on)' },
)

export const MessageObject = t.Object(
  {
    id: t.String(),
    type: t.Literal('message'),
    role: t.Literal('assistant'),
    model: t.String(),
    content: t.Array(t.Unknown()),
    stop_reason: t.Union([t.String(), t.Null()]),
    usage: t.Object({ input_tokens: t.Integer(), output_tokens: t.Integer() }, open),
  },
  open,
)

/** AnthropicError: modelgate's own refusals on the Messages API, in Anthropic's shape. */
export const AnthropicError = t.Object({
  type: t.Literal('error'),
  error: t.Object({
    type: t.String({
      examples: ['not_found_error', 'authentication_error', 'rate_limit_error', 'overloaded_error'],
    }),
    message: t.String(),
  }),
})
