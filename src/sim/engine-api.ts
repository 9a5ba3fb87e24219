import type { Server } from 'bun'
import { type ChatPlanner, serveMessages, serveResponses } from './agent-apis.ts'
import { methodNotAllowed, notFound, simError } from './errors.ts'
import { checkModel, planInference, readJson } from './openai-request.ts'
import { respondInference } from './openai-response.ts'
import { handlePooling, type PoolingRoute } from './pooling.ts'
import type { EngineRuntime } from './runtime.ts'
import type { PauseMode } from './sleep-state.ts'
import { type ChatMessage, renderChat } from './tokenizer.ts'
import { recordTraceparent } from './traces.ts'

/**
 * engineFetch is the simulated engine's HTTP API, route for route what the gateway uses of vLLM's
 * OpenAI server, with uvicorn's access log line per request. The development routes (`/sleep`,
 * `/wake_up`, `/is_sleeping`, `/collective_rpc`, `/reset_prefix_cache`) are mounted whenever
 * VLLM_SERVER_DEV_MODE is on, as in vLLM; whether sleeping does anything depends on
 * `--enable-sleep-mode` (see SleepFrees) and, on the V0 engine, answers an error without it.
 */
type Handler = (
  rt: EngineRuntime,
  req: Request,
  server: Server<unknown>,
  url: URL,
) => Response | Promise<Response>

const POOLING: Record<string, PoolingRoute> = {
  '/pooling': 'pooling',
  '/v1/embeddings': 'embeddings',
  '/classify': 'classify',
  '/score': 'score',
  '/v1/score': 'score',
  '/rerank': 'rerank',
  '/v1/rerank': 'rerank',
  '/v2/rerank': 'rerank',
}

const REASONS: Record<number, string> = {
  200: 'OK',
  400: 'Bad Request',
  404: 'Not Found',
  405: 'Method Not Allowed',
  499: 'Client Closed Request',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
}

function routes(): Map<string, Partial<Record<string, Handler>>> {
  const table = new Map<string, Partial<Record<string, Handler>>>()
  const add = (path: string, method: string, handler: Handler) =>
    table.set(path, { ...table.get(path), [method]: handler })
  add('/health', 'GET', (rt) => new Response(null, { status: rt.engineDead ? 503 : 200 }))
  add('/ping', 'GET', () => new Response(null, { status: 200 }))
  add('/ping', 'POST', () => new Response(null, { status: 200 }))
  add('/version', 'GET', (rt) => Response.json({ version: rt.version }))
  add('/v1/models', 'GET', (rt) => Response.json(modelList(rt)))
  add(
    '/metrics',
    'GET',
    (rt) =>
      new Response(
        rt.metrics.render({
          running: rt.scheduler.running.size,
          waiting: rt.scheduler.numWaiting,
          kvUsage: rt.scheduler.kvUsage(),
          ...(rt.knobs.profile.sleepComponents ? { components: rt.sleep.components } : {}),
        }),
        { headers: { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' } },
      ),
  )
  add('/v1/chat/completions', 'POST', (rt, req, server) => inference(rt, req, server, 'chat'))
  add('/v1/completions', 'POST', (rt, req, server) => inference(rt, req, server, 'completion'))
  add('/v1/responses', 'POST', (rt, req, server) => agentApi(rt, req, server, serveResponses))
  add('/v1/messages', 'POST', (rt, req, server) => agentApi(rt, req, server, serveMessages))
  add('/tokenize', 'POST', tokenize)
  add('/detokenize', 'POST', detokenize)
  for (const [path, route] of Object.entries(POOLING))
    add(path, 'POST', (rt, req) => handlePooling(rt, req, route))
  return table
}

const V0_SLEEP_ASSERTION = 'AssertionError: Sleep mode is not enabled in the model config'

/**
 * v0WithoutSleepMode: the V0 engine asserts `enable_sleep_mode` in sleep and wake_up; the failed
 * assertion reaches the client as starlette's bare 500 (the traceback goes to stderr).
 */
function v0WithoutSleepMode(rt: EngineRuntime): Response | undefined {
  if (rt.knobs.logStyle !== 'v0' || rt.args.enableSleepMode) return undefined
  rt.log.stderr(
    'ERROR:    Exception in ASGI application',
    'Traceback (most recent call last):',
    V0_SLEEP_ASSERTION,
  )
  return new Response('Internal Server Error', {
    status: 500,
    headers: { 'content-type': 'text/plain; charset=utf-8' },
  })
}

function engineDeadResponse(rt: EngineRuntime): Response | undefined {
  return rt.engineDead ? new Response(null, { status: 500 }) : undefined
}

const MODES = new Set<string>(['abort', 'wait', 'keep'])

/**
 * badPauseMode: vLLM passes `mode` on to the engine core, whose `pause_scheduler` raises
 * `ValueError: Invalid pause mode: …` before anything is paused; the failed utility call comes back
 * to the API server as a plain Exception, hence a 500 (not a 400) naming the call.
 */
function badPauseMode(rt: EngineRuntime, mode: string): Response {
  const error = `Invalid pause mode: ${mode}`
  rt.log.error(rt.tags.core, 'core.py:1127', 'Invocation of sleep method failed')
  rt.log.stdout(
    ...['Traceback (most recent call last):', `ValueError: ${error}`].map((l) =>
      rt.tags.core ? `${rt.tags.core} ${l}` : l,
    ),
  )
  return simError(rt.knobs.errorShape, 500, `Call to sleep method failed: ${error}`)
}

function devRoutes(): Map<string, Partial<Record<string, Handler>>> {
  const table = new Map<string, Partial<Record<string, Handler>>>()
  table.set('/sleep', {
    POST: async (rt, _req, _server, url) => {
      const dead = engineDeadResponse(rt) ?? v0WithoutSleepMode(rt)
      if (dead) return dead
      const modes = rt.knobs.profile.sleepModes
      const level = Number(url.searchParams.get('level') ?? '1')
      if (!(level === 1 || level === 2 || (modes && level === 0)))
        return simError(rt.knobs.errorShape, 400, `Invalid sleep level: ${level}`, 'level')
      const mode = url.searchParams.get('mode') ?? 'abort'
      if (modes && !MODES.has(mode)) return badPauseMode(rt, mode)
      await rt.sleepEngine(level as 0 | 1 | 2, mode as PauseMode)
      return new Response(null, { status: 200 })
    },
  })
  table.set('/wake_up', {
    POST: async (rt, _req, _server, url) => {
      const dead = engineDeadResponse(rt) ?? v0WithoutSleepMode(rt)
      if (dead) return dead
      // Any tag is taken: one that is not asleep (or unknown) makes the executor warn and wake
      // nothing, and the answer is still 200.
      const tags = url.searchParams.getAll('tags')
      if (rt.knobs.logStyle === 'v1') {
        const shown = tags.length > 0 ? `[${tags.map((t) => `'${t}'`).join(', ')}]` : 'None'
        rt.log.info(rt.tags.api, 'api_router.py:38', `wake up the engine with tags: ${shown}`)
      }
      await rt.wakeEngine(tags.length > 0 ? tags : undefined)
      return new Response(null, { status: 200 })
    },
  })
  table.set('/release_kv_cache_memory', {
    POST: async (rt) => {
      const dead = engineDeadResponse(rt)
      if (dead) return dead
      await rt.releaseKvCache()
      return new Response(null, { status: 200 })
    },
  })
  table.set('/is_sleeping', { GET: (rt) => Response.json({ is_sleeping: rt.sleep.sleeping }) })
  table.set('/collective_rpc', { POST: collectiveRpc })
  table.set('/reset_prefix_cache', {
    POST: (rt) => {
      rt.log.info(rt.tags.api, 'api_router.py:45', 'Resetting prefix cache...')
      return engineDeadResponse(rt) ?? new Response(null, { status: 200 })
    },
  })
  return table
}

/**
 * httpError is what vLLM's HTTPException handler makes of `raise HTTPException(status, detail)`:
 * its error shape, with the status's phrase as the type (`Bad Request`).
 */
function httpError(rt: EngineRuntime, status: 400, message: string): Response {
  const type = 'Bad Request'
  const body =
    rt.knobs.errorShape === 'old'
      ? { object: 'error', message, type, param: null, code: status }
      : { error: { message, type, param: null, code: status } }
  return Response.json(body, { status })
}

/**
 * collectiveRpc is `POST /collective_rpc {"method", "args"?, "kwargs"?, "timeout"?}`: the method runs on
 * every worker and the answer is `{"results": [one per worker]}` (`reload_weights` returns None on
 * each). A body that is not JSON or has no `method` is the route's HTTPException 400, rendered by
 * vLLM's handler in its error shape; a method workers lack fails like vLLM's `run_method`.
 */
async function collectiveRpc(rt: EngineRuntime, req: Request): Promise<Response> {
  let body: unknown
  try {
    body = await req.json()
  } catch (err) {
    return httpError(rt, 400, `JSON decode error: ${(err as Error).message}`)
  }
  const method = (body as { method?: unknown } | null)?.method
  if (method === undefined || method === null) return httpError(rt, 400, "Missing 'method' in request body")
  const dead = engineDeadResponse(rt)
  if (dead) return dead
  const results = Array.from({ length: rt.workerCount }, () => null)
  if (method === 'reload_weights') {
    await rt.reloadWeights()
    return Response.json({ results })
  }
  if (method === 'check_health') return Response.json({ results })
  return simError(
    rt.knobs.errorShape,
    500,
    `Method ${JSON.stringify(String(method)).replaceAll('"', "'")} is not implemented.`,
  )
}

/** modelList: one card per served name (vLLM's `base_model_paths`), each rooted at the model. */
function modelList(rt: EngineRuntime) {
  const created = rt.createdAt
  const names = rt.args.servedModelNames.length > 0 ? rt.args.servedModelNames : [rt.args.model]
  return {
    object: 'list',
    data: names.map((id) => ({
      id,
      object: 'model',
      created,
      owned_by: 'vllm',
      root: rt.args.model,
      parent: null,
      max_model_len: rt.maxModelLen,
      permission: [
        {
          id: `modelperm-${rt.createdAt.toString(16)}`,
          object: 'model_permission',
          created,
          allow_create_engine: false,
          allow_sampling: true,
          allow_logprobs: true,
          allow_search_indices: false,
          allow_view: true,
          allow_fine_tuning: false,
          organization: '*',
          group: null,
          is_blocking: false,
        },
      ],
    })),
  }
}

async function inference(
  rt: EngineRuntime,
  req: Request,
  server: Server<unknown>,
  kind: 'chat' | 'completion',
) {
  recordTraceparent(rt.simDir, rt.args.port, req)
  const body = await readJson(rt, req)
  if (body instanceof Response) return body
  const plan = planInference(rt, kind, body)
  if (plan instanceof Response) return plan
  if (rt.engineDead) {
    rt.engineDeadRequest()
    return new Response(null, { status: 500 })
  }
  return respondInference(rt, req, server, plan)
}

/** agentApi serves the Responses or Messages API through the chat path (see agent-apis.ts). */
async function agentApi(
  rt: EngineRuntime,
  req: Request,
  server: Server<unknown>,
  serve: typeof serveResponses,
): Promise<Response> {
  recordTraceparent(rt.simDir, rt.args.port, req)
  const body = await readJson(rt, req)
  if (body instanceof Response) return body
  const planChat: ChatPlanner = (chat) => {
    const plan = planInference(rt, 'chat', chat)
    if (plan instanceof Response || !rt.engineDead) return plan
    rt.engineDeadRequest()
    return new Response(null, { status: 500 })
  }
  return serve(rt, req, server, body, planChat)
}

async function tokenize(rt: EngineRuntime, req: Request): Promise<Response> {
  const body = await readJson(rt, req)
  if (body instanceof Response) return body
  const model = checkModel(rt, body)
  if (model instanceof Response) return model
  let text: string
  if (Array.isArray(body['messages']))
    text = renderChat(body['messages'] as ChatMessage[], body['add_generation_prompt'] !== false)
  else if (typeof body['prompt'] === 'string') text = body['prompt']
  else return simError(rt.knobs.errorShape, 400, "Field required: 'prompt' or 'messages'", 'prompt')
  const tokens = rt.tokenizer.encode(text)
  return Response.json({ count: tokens.length, max_model_len: rt.maxModelLen, tokens, token_strs: null })
}

async function detokenize(rt: EngineRuntime, req: Request): Promise<Response> {
  const body = await readJson(rt, req)
  if (body instanceof Response) return body
  const model = checkModel(rt, body)
  if (model instanceof Response) return model
  const tokens = body['tokens']
  if (!Array.isArray(tokens) || !tokens.every((t) => Number.isInteger(t))) {
    return simError(rt.knobs.errorShape, 400, "Field required: 'tokens' must be a list of integers", 'tokens')
  }
  return Response.json({ prompt: rt.tokenizer.decode(tokens as number[]) })
}

export function engineFetch(rt: EngineRuntime): (req: Request, server: Server<unknown>) => Promise<Response> {
  const table = routes()
  if (rt.knobs.devMode) for (const [k, v] of devRoutes()) table.set(k, v)
  // Older builds have no such route (a 404 for any method).
  if (!rt.knobs.profile.sleepComponents) table.delete('/release_kv_cache_memory')
  if (!rt.knobs.profile.responsesApi) table.delete('/v1/responses')
  if (!rt.knobs.profile.messagesApi) table.delete('/v1/messages')
  return async (req, server) => {
    const url = new URL(req.url)
    const methods = table.get(url.pathname)
    let res: Response
    if (!methods) res = notFound()
    else {
      const handler = methods[req.method] ?? (req.method === 'HEAD' ? methods['GET'] : undefined)
      try {
        res = handler ? await handler(rt, req, server, url) : methodNotAllowed()
      } catch (err) {
        res = simError(rt.knobs.errorShape, 500, (err as Error).message)
      }
    }
    if (!rt.args.disableAccessLog) {
      const ip = server.requestIP(req)
      const client = ip ? `${ip.address}:${ip.port}` : '127.0.0.1:0'
      rt.log.stdout(
        `INFO:     ${client} - "${req.method} ${url.pathname}${url.search} HTTP/1.1" ${res.status} ${REASONS[res.status] ?? ''}`,
      )
    }
    return res
  }
}
