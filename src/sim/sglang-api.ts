import type { Server } from 'bun'
import { serveMessages, serveResponses } from './agent-apis.ts'
import { errorBody } from './errors.ts'
import { Generation } from './generation.ts'
import { type InferencePlan, planInference, promptOf } from './openai-request.ts'
import { respondInference } from './openai-response.ts'
import type { SglangEngine } from './sglang-engine.ts'
import { type ChatMessage, renderChat } from './tokenizer.ts'

/**
 * The simulated SGLang server's HTTP API, route for route what entrypoints/http_server.py answers
 * for what the gateway, the router and the benchmarks use, with uvicorn's access log line per
 * request and SGLang's error shapes:
 *
 * - FastAPI's validation errors are rewritten to 400 `{"object":"error","message",…,"type":"Bad
 *   Request","code":400}`; a body that is not JSON, or a JSON endpoint called without
 *   `content-type: application/json` (validate_json_request), is one of those;
 * - the OpenAI handlers' errors are `{"object":"error","message","type":"BadRequestError",
 *   "param":null,"code":400}` (create_error_response); the native ones `{"error":{"message"}}` 400;
 * - unknown routes are FastAPI's 404 `{"detail":"Not Found"}`;
 * - the OpenAI handlers do not check `model` against the served name (any name is answered and
 *   echoed); the length checks are the tokenizer manager's (`The input (N tokens) is longer than
 *   the model's context length (M tokens).`, `Requested token count exceeds …`).
 */
type Handler = (e: SglangEngine, req: Request, server: Server<unknown>) => Response | Promise<Response>

const REASONS: Record<number, string> = {
  200: 'OK',
  400: 'Bad Request',
  404: 'Not Found',
  405: 'Method Not Allowed',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
}

function validationError(message: string): Response {
  return Response.json(
    { object: 'error', message, type: 'Bad Request', param: null, code: 400 },
    { status: 400 },
  )
}

function openaiError(message: string, status = 400): Response {
  return Response.json(errorBody('old', status, message), { status })
}

/** body: the JSON object of a request, or the validation error FastAPI would answer. */
async function body(req: Request, requireJsonType: boolean): Promise<Record<string, unknown> | Response> {
  const type = (req.headers.get('content-type') ?? '').split(';')[0]?.trim().toLowerCase()
  if (requireJsonType && type !== 'application/json')
    return validationError(
      "[{'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: Only 'application/json' is allowed\", 'type': 'value_error'}]",
    )
  const text = await req.text()
  if (text.trim() === '')
    return validationError("[{'type': 'missing', 'loc': ('body',), 'msg': 'Field required', 'input': None}]")
  try {
    const parsed = JSON.parse(text) as unknown
    if (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed))
      return parsed as Record<string, unknown>
  } catch (err) {
    return validationError(
      `[{'type': 'json_invalid', 'loc': ('body', 0), 'msg': 'JSON decode error', 'ctx': {'error': '${(err as Error).message}'}}]`,
    )
  }
  return validationError(
    "[{'type': 'dict_type', 'loc': ('body',), 'msg': 'Input should be a valid dictionary'}]",
  )
}

/** health: /health and /health_generate (see SglangEngine for what each state answers). */
async function health(e: SglangEngine, req: Request): Promise<Response> {
  if (e.dying || !e.ready) return new Response(null, { status: 503 })
  if (!e.healthGeneration && new URL(req.url).pathname === '/health')
    return new Response(null, { status: e.schedulerDead ? 503 : 200 })
  if (e.sleep.blocksInference) {
    e.crash('RuntimeError: CUDA error: an illegal memory access was encountered')
    return new Promise<Response>(() => {})
  }
  const started = performance.now()
  while (performance.now() - started < e.healthTimeoutMs) {
    await Bun.sleep(Math.min(e.healthTickMs, e.healthTimeoutMs))
    if (e.dying) return new Response(null, { status: 503 })
    if (!e.schedulerDead) return new Response(null, { status: 200 })
  }
  e.log.error(
    '',
    'http_server.py',
    `Health check failed. Server couldn't get a response from detokenizer for last ${e.healthTimeoutMs / 1000} seconds.`,
  )
  return new Response(null, { status: 503 })
}

/** release / resume: `{"tags": [...]}` optional; the scheduler's own rules are SglangEngine's. */
function memory(op: 'release' | 'resume'): Handler {
  return async (e, req) => {
    const b = await body(req, false)
    if (b instanceof Response) return b
    const tags = b['tags']
    if (
      tags !== undefined &&
      tags !== null &&
      !(Array.isArray(tags) && tags.every((t) => typeof t === 'string'))
    )
      return validationError(
        "[{'type': 'list_type', 'loc': ('body', 'tags'), 'msg': 'Input should be a valid list'}]",
      )
    const list = Array.isArray(tags) ? (tags as string[]) : undefined
    await Bun.sleep(op === 'release' ? 20 : e.knobs.wakeDelayMs / 3)
    if (op === 'release') e.releaseMemory(list)
    else e.resumeMemory(list)
    // A scheduler exception takes the server down: the call gets no answer (its connection drops).
    if (e.dying) return new Promise<Response>(() => {})
    return Response.json(null)
  }
}

/** lengthError: the tokenizer manager's checks, before anything is scheduled. */
function lengthError(e: SglangEngine, input: number, maxNew: number | undefined): Response | null {
  const ctx = e.maxModelLen
  if (input >= ctx)
    return openaiError(
      `The input (${input} tokens) is longer than the model's context length (${ctx} tokens).`,
    )
  if (maxNew !== undefined && input + maxNew >= ctx)
    return openaiError(
      `Requested token count exceeds the model's maximum context length of ${ctx} tokens. You requested a ` +
        `total of ${input + maxNew} tokens: ${input} tokens from the input messages and ${maxNew} tokens for ` +
        'the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.',
    )
  return null
}

/** planOpenai is SGLang's OpenAI request checks and planning, for chat, completions and the chat-backed APIs. */
async function planOpenai(
  e: SglangEngine,
  kind: 'chat' | 'completion',
  b: Record<string, unknown>,
): Promise<InferencePlan | Response> {
  const prompt = promptOf(kind, b)
  if (prompt === undefined)
    return openaiError(kind === 'chat' ? 'Messages cannot be empty.' : 'Prompt cannot be empty.')
  const input = typeof prompt === 'string' ? e.tokenizer.encode(prompt).length : prompt.length
  const requested = kind === 'chat' ? (b['max_completion_tokens'] ?? b['max_tokens']) : b['max_tokens']
  const tooLong = lengthError(e, input, typeof requested === 'number' ? requested : undefined)
  if (tooLong) return tooLong
  const asked = typeof b['model'] === 'string' ? b['model'] : undefined
  const plan = planInference(e, kind, { ...b, model: e.sglang.servedModelName })
  if (plan instanceof Response) return plan
  if (asked) plan.model = asked
  if (e.schedulerDead) return new Promise<Response>(() => {})
  return plan
}

function openai(kind: 'chat' | 'completion'): Handler {
  return async (e, req, server) => {
    const b = await body(req, true)
    if (b instanceof Response) return b
    const plan = await planOpenai(e, kind, b)
    return plan instanceof Response ? plan : respondInference(e, req, server, plan)
  }
}

/** agentApi: `/v1/responses` and `/v1/messages` through the chat planning (see agent-apis.ts). */
function agentApi(serve: typeof serveResponses): Handler {
  return async (e, req, server) => {
    const b = await body(req, true)
    if (b instanceof Response) return b
    return serve(e, req, server, b, (chat) => planOpenai(e, 'chat', chat), 'sglang')
  }
}

async function generate(e: SglangEngine, req: Request): Promise<Response> {
  const b = await body(req, false)
  if (b instanceof Response) return b
  const text = typeof b['text'] === 'string' ? b['text'] : ''
  const sp = (b['sampling_params'] ?? {}) as { max_new_tokens?: unknown }
  const maxNew = typeof sp.max_new_tokens === 'number' ? sp.max_new_tokens : 128
  const promptTokens = e.tokenizer.encode(text).length
  if (e.sleep.blocksInference) e.crash('RuntimeError: CUDA error: an illegal memory access was encountered')
  const id = crypto.randomUUID().replaceAll('-', '')
  return new Promise((resolve) => {
    let out = ''
    const started = performance.now()
    const gen = new Generation(
      e,
      { id, promptTokens, maxTokens: maxNew, eosAfter: maxNew, ignoreEos: true, seed: promptTokens },
      {
        token: (t) => {
          out += t
        },
        done: (completion) =>
          resolve(
            Response.json({
              text: out,
              meta_info: {
                id,
                finish_reason: { type: 'length', length: completion },
                prompt_tokens: promptTokens,
                completion_tokens: completion,
                cached_tokens: 0,
                e2e_latency: (performance.now() - started) / 1000,
              },
            }),
          ),
        fail: (message) => resolve(Response.json({ error: { message } }, { status: 400 })),
        aborted: () => resolve(Response.json({ error: { message: 'aborted' } }, { status: 400 })),
      },
    )
    gen.start()
  })
}

async function tokenize(e: SglangEngine, req: Request): Promise<Response> {
  const b = await body(req, true)
  if (b instanceof Response) return b
  let text: string
  if (typeof b['prompt'] === 'string') text = b['prompt']
  else if (Array.isArray(b['messages'])) text = renderChat(b['messages'] as ChatMessage[], true)
  else return validationError("[{'type': 'missing', 'loc': ('body', 'prompt'), 'msg': 'Field required'}]")
  const tokens = e.tokenizer.encode(text)
  return Response.json({ tokens, count: tokens.length, max_model_len: e.maxModelLen })
}

function routes(): Map<string, Partial<Record<string, Handler>>> {
  const t = new Map<string, Partial<Record<string, Handler>>>()
  const add = (path: string, methods: string[], h: Handler) => {
    for (const m of methods) t.set(path, { ...t.get(path), [m]: h })
  }
  add('/health', ['GET'], health)
  add('/health_generate', ['GET'], health)
  add('/ping', ['GET'], () => new Response(null, { status: 200 }))
  add('/get_model_info', ['GET'], (e) =>
    Response.json({
      model_path: e.sglang.modelPath,
      tokenizer_path: e.sglang.modelPath,
      is_generation: true,
      preferred_sampling_params: null,
      weight_version: 'default',
    }),
  )
  add('/get_server_info', ['GET'], (e) =>
    Response.json({
      model_path: e.sglang.modelPath,
      served_model_name: e.sglang.servedModelName,
      tp_size: e.sglang.tpSize,
      mem_fraction_static: e.plan.fraction,
      context_length: e.sglang.contextLength ?? null,
      max_total_num_tokens: e.plan.kvTokens,
      internal_states: [{}],
      version: e.profile.version,
    }),
  )
  add('/v1/models', ['GET'], (e) =>
    Response.json({
      object: 'list',
      data: [
        {
          id: e.sglang.servedModelName,
          object: 'model',
          created: e.createdAt,
          owned_by: 'sglang',
          root: e.sglang.servedModelName,
          max_model_len: e.maxModelLen,
        },
      ],
    }),
  )
  add('/v1/chat/completions', ['POST'], openai('chat'))
  add('/v1/completions', ['POST'], openai('completion'))
  add('/v1/responses', ['POST'], agentApi(serveResponses))
  add('/v1/messages', ['POST'], agentApi(serveMessages))
  add('/generate', ['POST', 'PUT'], generate)
  add('/tokenize', ['POST'], tokenize)
  add('/v1/tokenize', ['POST'], tokenize)
  add('/flush_cache', ['GET', 'POST'], (e) => {
    const ok = e.busy === 0
    return new Response(
      'Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n',
      { status: ok ? 200 : 400 },
    )
  })
  add('/get_load', ['GET'], (e) => Response.json([e.load()]))
  add('/pause_generation', ['POST'], async (e, req) => {
    const b = await body(req, false)
    if (b instanceof Response) return b
    e.pauseGeneration()
    return Response.json({ message: 'Generation paused successfully.', status: 200 })
  })
  add('/continue_generation', ['POST'], async (e, req) => {
    const b = await body(req, false)
    if (b instanceof Response) return b
    e.continueGeneration()
    return Response.json({ message: 'Generation continued successfully.', status: 200 })
  })
  add('/release_memory_occupation', ['GET', 'POST'], memory('release'))
  add('/resume_memory_occupation', ['GET', 'POST'], memory('resume'))
  add('/update_weights_from_disk', ['POST'], async (e, req) => {
    const b = await body(req, false)
    if (b instanceof Response) return b
    if (e.isReleased('weights')) {
      e.crash('RuntimeError: CUDA error: an illegal memory access was encountered')
      return new Promise<Response>(() => {})
    }
    await Bun.sleep(e.knobs.reloadDelayMs)
    e.sleep.weightsValid = true
    return Response.json({
      success: true,
      message: 'Succeeded to update model weights.',
      num_paused_requests: 0,
    })
  })
  return t
}

export function startServing(e: SglangEngine): void {
  const table = routes()
  // uvicorn binds its own socket when it starts (after the model is loaded), with SO_REUSEADDR and
  // without SO_REUSEPORT (Bun would turn the latter on by itself outside development mode).
  e.server = Bun.serve({
    hostname: e.sglang.host,
    port: e.sglang.port,
    reusePort: false,
    idleTimeout: 120,
    development: false,
    fetch: async (req, server) => {
      const url = new URL(req.url)
      let res: Response
      if (url.pathname === '/metrics' && e.sglang.enableMetrics && req.method === 'GET') {
        res = new Response(
          e.metrics.render({
            running: e.load()['num_running_reqs'] ?? 0,
            queued: e.load()['num_waiting_reqs'] ?? 0,
            paused: e.load()['num_paused_reqs'] ?? 0,
            usedTokens: e.scheduler.usedTokens,
            tokenUsage: e.scheduler.kvUsage(),
          }),
          { headers: { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' } },
        )
      } else {
        const methods = table.get(url.pathname)
        const handler = methods?.[req.method]
        if (!methods) res = Response.json({ detail: 'Not Found' }, { status: 404 })
        else if (!handler) res = Response.json({ detail: 'Method Not Allowed' }, { status: 405 })
        else res = await handler(e, req, server)
      }
      const ip = server.requestIP(req)
      e.log.access(
        `${ip ? `${ip.address}:${ip.port}` : '127.0.0.1:0'} - "${req.method} ${url.pathname}${url.search} HTTP/1.1" ${res.status} ${REASONS[res.status] ?? ''}`,
      )
      return res
    },
    error: (err) =>
      Response.json(
        { object: 'error', message: err.message, type: 'InternalServerError', param: null, code: 500 },
        { status: 500 },
      ),
  })
}
