import { Elysia, type t } from 'elysia'
import { inferenceShape, proxyError } from '../http/errors.ts'
import { ProxyError } from '../http/schemas.ts'
import { pathOf } from '../http/url.ts'
import {
  AnthropicError,
  ChatCompletion,
  ChatCompletionRequest,
  Completion,
  CompletionRequest,
  DetokenizeRequest,
  DetokenizeResponse,
  EngineRequest,
  EngineResponse,
  MessageObject,
  MessagesRequest,
  ModelList,
  ResponseObject,
  ResponsesRequest,
  TokenizeRequest,
  TokenizeResponse,
} from './openai-schemas.ts'

/**
 * openaiRoutes declares the inference routes in Elysia so /docs shows their shapes. They are served
 * only by the listener's front (the plugin's hot routes, matched on the exact path): a request that
 * reaches one of these declarations went past the front under another spelling (a trailing slash)
 * and gets the proxy-shaped 404 of an unknown route, as any path the front does not serve.
 */
export interface OpenaiRoutesOptions {
  /** OpenAPI tag of every route. */
  tag: string
  /** Whether `/api/direct/:port/*` is declared too. */
  direct: boolean
  /** Which model routes exist (gateway path → engine path), in the order to document them. */
  paths: Readonly<Record<string, string>>
}

/** jsonBody documents a request body without Elysia validating it (the proxy forwards the bytes). */
function jsonBody(schema: unknown) {
  return { required: true, content: { 'application/json': { schema } } }
}

const errors = {
  400: ProxyError,
  401: ProxyError,
  502: ProxyError,
  503: ProxyError,
  504: ProxyError,
}

const ERROR_NOTES =
  'Errors use the proxy shape `{error: {message, type, param?, code}}`: 400 `invalid_json`, `missing_model`, ' +
  '`invalid_model` (param model) for an unknown model; 401 `missing_api_key` / `invalid_api_key` when ' +
  'INFERENCE_API_KEY is set; 503 `model_not_ready` (starting) or `model_sleeping`, with Retry-After; ' +
  '502 `upstream_unavailable` (engine refused or reset the connection); 504 `upstream_connect_timeout` / ' +
  '`upstream_timeout` (no first byte within the deadline). Engine errors (4xx/5xx) pass through unchanged.'

const MESSAGES_NOTES =
  'modelgate\'s own refusals use Anthropic\'s shape `{type: "error", error: {type, message}}` with its ' +
  'status codes: 400 `invalid_request_error`; 401 `authentication_error` (the key may be sent as ' +
  '`x-api-key`, as Anthropic clients do, or as a Bearer token); 403 `permission_error`; 404 ' +
  '`not_found_error` for an unknown model; 429 `rate_limit_error` (a key over its limits); 529 ' +
  '`overloaded_error` for a full queue, a model asleep or loading, or a server stopping (with Retry-After); ' +
  '502 `api_error` and 504 `timeout_error` when the engine fails. A stream cut by the engine ends with an ' +
  '`event: error`. Engine errors pass through unchanged.'

interface RouteDoc {
  summary: string
  /** the route's own error notes (else ERROR_NOTES, OpenAI's shape) */
  notes?: string
  body: ReturnType<typeof t.Object>
  ok: ReturnType<typeof t.Object> | ReturnType<typeof t.Record>
}

const DOCS: Record<string, RouteDoc> = {
  '/v1/chat/completions': {
    summary: 'Chat completion (OpenAI-compatible; stream or not)',
    body: ChatCompletionRequest,
    ok: ChatCompletion,
  },
  '/v1/completions': {
    summary: 'Text completion (OpenAI-compatible)',
    body: CompletionRequest,
    ok: Completion,
  },
  '/v1/responses': {
    summary: 'OpenAI Responses API (stream or not; usage in `response.completed`)',
    body: ResponsesRequest,
    ok: ResponseObject,
  },
  '/v1/messages': {
    summary: 'Anthropic Messages API (stream or not; usage in `message_start` and `message_delta`)',
    body: MessagesRequest,
    ok: MessageObject,
    notes: MESSAGES_NOTES,
  },
  '/v1/embeddings': {
    summary: 'Embeddings (pooling models)',
    body: EngineRequest('OpenAI embeddings request: model, input'),
    ok: EngineResponse('OpenAI embeddings list'),
  },
  '/tokenize': { summary: 'Tokenize a prompt or chat messages', body: TokenizeRequest, ok: TokenizeResponse },
  '/detokenize': {
    summary: 'Turn token ids back into text',
    body: DetokenizeRequest,
    ok: DetokenizeResponse,
  },
  '/pooling': {
    summary: 'Pooling (raw hidden-state outputs of a pooling model)',
    body: EngineRequest('Engine pooling request: model, input'),
    ok: EngineResponse('Engine pooling response'),
  },
  '/classification': {
    summary: 'Classification (engine /classify)',
    body: EngineRequest('Engine classify request: model, input'),
    ok: EngineResponse('Engine classify response'),
  },
  '/score': {
    summary: 'Score text pairs (engine /score)',
    body: EngineRequest('Engine score request: model, text_1, text_2'),
    ok: EngineResponse('Engine score response'),
  },
  '/re-rank': {
    summary: 'Re-rank documents against a query (engine /rerank)',
    body: EngineRequest('Engine rerank request: model, query, documents'),
    ok: EngineResponse('Engine rerank response'),
  },
}

/** servedByTheFront: what a documented inference route answers when the front did not serve it. */
export function servedByTheFront({ request }: { request: Request }): never {
  throw proxyError(
    404,
    'invalid_request_error',
    'not_found',
    `No route for ${request.method} ${pathOf(request.url)}`,
  )
}

export function openaiRoutes(opts: OpenaiRoutesOptions) {
  const tags = [opts.tag]
  let app = new Elysia({ name: `inference-${opts.tag}` }).get('/v1/models', servedByTheFront, {
    detail: {
      tags,
      summary: 'List the models that can be named in `model`',
      description: 'Every active instance, once by served model name and once by instance id.',
    },
    response: { 200: ModelList, 401: ProxyError },
  })
  for (const [path, enginePath] of Object.entries(opts.paths)) {
    const doc: RouteDoc = DOCS[path] ?? {
      summary: `Proxied to the engine's ${enginePath}`,
      body: EngineRequest('Engine request'),
      ok: EngineResponse('Engine response'),
    }
    const anthropic = inferenceShape(path) === 'anthropic'
    app = app.post(path, servedByTheFront, {
      parse: 'none',
      response: anthropic
        ? Object.fromEntries(
            [200, 400, 401, 403, 404, 429, 502, 504, 529].map((s) => [
              s,
              s === 200 ? doc.ok : AnthropicError,
            ]),
          )
        : { 200: doc.ok, ...errors },
      detail: {
        tags,
        summary: doc.summary,
        requestBody: jsonBody(doc.body) as never,
        description: `Forwarded unchanged to the engine's \`${enginePath}\` of the instance chosen for \`model\` (least outstanding requests). ${doc.notes ?? ERROR_NOTES}`,
      },
    }) as unknown as typeof app
  }
  if (opts.direct) {
    const doc = {
      parse: 'none' as const,
      response: { 404: ProxyError, 401: ProxyError, 502: ProxyError, 504: ProxyError },
      detail: {
        tags,
        summary: 'Direct proxy to one engine port (testing)',
        description:
          'Forwards method, sub-path, query, headers (minus hop-by-hop ones and host) and body to the engine ' +
          'listening on `port`, bypassing model routing; JSON replies are returned as they are and streams are ' +
          'piped. Only ports of instances this gateway manages are reachable (any other port: 404 ' +
          '`unknown_port`). Engine replies pass through with their status. Any method is forwarded; `path` is the ' +
          'rest of the URL and may contain slashes (e.g. `v1/chat/completions`).',
      },
    }
    // The OpenAPI generator skips wildcard paths: document `{path}` (which may hold slashes, see the
    // description), and let hidden catch-alls serve deeper paths and the other methods.
    const route = '/api/direct/:port/:path'
    const hidden = { parse: 'none' as const, detail: { hide: true } }
    app = app
      .get(route, servedByTheFront, doc)
      .post(route, servedByTheFront, doc)
      .put(route, servedByTheFront, doc)
      .patch(route, servedByTheFront, doc)
      .delete(route, servedByTheFront, doc)
      .all(route, servedByTheFront, hidden)
      .all('/api/direct/:port/*', servedByTheFront, hidden)
      .all('/api/direct/:port', servedByTheFront, hidden) as unknown as typeof app
  }
  return app
}
