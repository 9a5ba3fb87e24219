import { type DocumentDecoration, Elysia } from 'elysia'
import type { Logger } from '../../src/host/logger.ts'
import { AppError } from '../../src/http/errors.ts'
import { servedByTheFront } from '../../src/wire/openai-routes.ts'
import {
  ChatCompletion,
  ChatCompletionRequest,
  Completion,
  CompletionRequest,
  MessageObject,
  MessagesRequest,
  ResponseObject,
  ResponsesRequest,
} from '../../src/wire/openai-schemas.ts'
import { internalError, routeNotFound } from './errors.ts'
import {
  intParam,
  modelParam,
  positiveInt,
  type RouteContext,
  thresholdParam,
  windowParam,
} from './params.ts'
import {
  ActionResultSchema,
  ActiveModelsSchema,
  HealthSchema,
  IdleModelsSchema,
  ModelHealthSchema,
  ModelListSchema,
  ModelTrafficDetailSchema,
  RouterError,
  ServerInfoSchema,
  SleepCandidatesSchema,
  SleepStatusSchema,
  TrafficStatsSchema,
} from './schemas.ts'
import type { RouterService } from './service.ts'

/**
 * routerRoutes: every route of the router listener (documented at its /docs), thin over RouterService.
 * Parameters are checked here (not by Elysia's validator) so that every error, including a bad
 * `threshold`, comes out in the router's one error shape; their schemas are declared in `detail`
 * for /docs. The two inference routes are served as raw routes on the listener; they are declared
 * here for /docs and for `app.handle()`, and call the same handler.
 */
const tags = ['router']

function render(err: unknown, log: Logger, path: string): Response {
  if (err instanceof AppError) return err.toResponse('proxy')
  log.error('router route failed', {
    path,
    error: err instanceof Error ? (err.stack ?? err.message) : String(err),
  })
  return internalError().toResponse('proxy')
}

/**
 * KEY_RULE: which requests need the gateway's inference key (plugins/router/access.ts), said once
 * for the inference routes and the actions.
 */
const KEY_RULE =
  'With `auth.inference_api_key` set and the router following the gateway (`from_gateway`, gateway ' +
  'plugin on), a request for a gateway model needs `Authorization: Bearer <inference key>`, as on the ' +
  "gateway's /v1: 401 `missing_api_key` / `invalid_api_key` otherwise, before anything else happens " +
  '(nothing reaches the engine, nothing sleeps or wakes, the request is not counted in the traffic ' +
  'statistics nor as activity). A name the router does not know needs the key too (401 without it, ' +
  '404 `model_not_found` with it), so a caller without the key cannot tell gateway models from unknown ' +
  'names by the answer. Standalone models (`plugins.router.models`) need no key.'

const ACTION_KEY_RULE = `${KEY_RULE} A path without a model name is an unknown route (404 \`not_found\`): it names no model.`

const authError = { 401: RouterError }

const MODELS_RULE =
  "While the gateway's models need a key (see the inference routes), the list holds the standalone " +
  "models and the gateway models the caller's key may use; without a key it holds the standalone " +
  'models alone, or is 401 when there are none. An admin token (`auth.mode` simple or oauth) sees ' +
  "every model. `endpoint` is the engine's address for an admin (or while admin access is open, " +
  '`auth.mode: none`); for anyone else it is {host: "", port: 0}, as for a model with no engine yet: ' +
  'an engine has no authentication of its own.'

export function routerRoutes(service: RouterService, log: Logger) {
  const guard =
    <R>(fn: (c: RouteContext) => R | Promise<R>) =>
    async (c: RouteContext): Promise<R> => {
      try {
        return await fn(c)
      } catch (err) {
        // A Response is sent as it is (Elysia validates only plain return values against `response`).
        return render(err, log, new URL(c.request.url).pathname) as unknown as R
      }
    }
  const listModels = guard(({ request }) => service.modelsFor(request.headers.get('authorization')))
  // Served by the listener's front (RouterInference.wire); declared here for /docs.
  const inference = servedByTheFront
  const inferenceDoc = (summary: string, body: object, ok: unknown) => ({
    parse: 'none' as const,
    response: {
      200: ok as typeof ChatCompletion,
      400: RouterError,
      ...authError,
      404: RouterError,
      502: RouterError,
      503: RouterError,
      504: RouterError,
    },
    detail: {
      tags,
      summary,
      description:
        'Forwarded unchanged to the engine serving `model` (extra engine parameters pass through). A sleeping ' +
        'model is woken by the request: with `wake_on_request: reject` the answer is 503 `model_waking` with ' +
        'Retry-After, with `hold` the request waits until the engine is awake (503 after `hold_timeout`). ' +
        'Errors: 400 `invalid_parameter` (no model, max_tokens not a positive integer), 400 `invalid_json`, ' +
        '404 `model_not_found`, 502 `wake_failed` / `upstream_unavailable`, 504 `upstream_timeout`; engine ' +
        'errors pass through unchanged. ' +
        KEY_RULE +
        ' A body that names no model (400) names no gateway model either: it needs no key.',
      requestBody: {
        required: true,
        content: { 'application/json': { schema: body } },
      } as DocumentDecoration['requestBody'],
    },
  })

  return new Elysia({ name: 'router-routes' })
    .post(
      '/v1/chat/completions',
      inference,
      inferenceDoc('Chat completion (OpenAI-compatible)', ChatCompletionRequest, ChatCompletion),
    )
    .post(
      '/v1/completions',
      inference,
      inferenceDoc('Text completion (OpenAI-compatible)', CompletionRequest, Completion),
    )
    .post(
      '/v1/responses',
      inference,
      inferenceDoc('OpenAI Responses API (usage in `response.completed`)', ResponsesRequest, ResponseObject),
    )
    .post(
      '/v1/messages',
      inference,
      inferenceDoc(
        "Anthropic Messages API (`x-api-key` accepted as the key; the router's own refusals in Anthropic's " +
          'shape: `{type: "error", error: {type, message}}`, 404 `not_found_error`, 529 `overloaded_error` ' +
          'for what other routes answer 503)',
        MessagesRequest,
        MessageObject,
      ),
    )
    .get('/v1/models', listModels, {
      response: { 200: ModelListSchema, ...authError, 429: RouterError },
      detail: {
        tags,
        summary: 'Models (OpenAI client `models.list()`); same as GET /models',
        description: MODELS_RULE,
      },
    })
    .get('/models', listModels, {
      response: { 200: ModelListSchema, ...authError, 429: RouterError },
      detail: {
        tags,
        summary: 'Configured models with their endpoints (and gateway models with from_gateway)',
        description: MODELS_RULE,
      },
    })
    .get(
      '/models/idle',
      guard(({ query }) => service.idleModels(positiveInt(query, 'threshold') ?? 300)),
      {
        response: { 200: IdleModelsSchema, 400: RouterError },
        detail: {
          tags,
          summary: 'Models without traffic for at least `threshold` seconds',
          description:
            'A model with requests in flight is never idle; one that has had no traffic is idle since the router ' +
            'started (last_activity null). Sleeping models are listed too.',
          parameters: [thresholdParam],
        },
      },
    )
    .get(
      '/models/active',
      guard(({ query }) => {
        const threshold = positiveInt(query, 'threshold') ?? 300
        return service.activeModels(threshold, positiveInt(query, 'window'))
      }),
      {
        response: { 200: ActiveModelsSchema, 400: RouterError },
        detail: {
          tags,
          summary: 'Models with traffic within the last `threshold` seconds',
          description:
            '`request_count` counts requests that ended within `window` seconds (default: `threshold`).',
          parameters: [thresholdParam, intParam('window', 'seconds (default: threshold)')],
        },
      },
    )
    .get(
      '/traffic/stats',
      guard(({ query }) => service.trafficStats(positiveInt(query, 'window'))),
      {
        response: { 200: TrafficStatsSchema, 400: RouterError },
        detail: {
          tags,
          summary: 'Traffic statistics, overall and by model',
          description:
            'A request counts when its response has fully ended (a stream at its last byte); 2xx is a success, ' +
            'anything else (router refusals, engine errors, client aborts) a failure. Requests naming an unknown ' +
            'model, and requests refused for the inference key (401), are not counted. `window` limits to ' +
            'the last N seconds (one-second resolution up to an hour, ' +
            'one-minute up to a day; longer windows cover a day).',
          parameters: [windowParam],
        },
      },
    )
    .get(
      '/traffic/stats/:model_name',
      guard(({ params, query }) => service.modelTraffic(params.model_name!, positiveInt(query, 'window'))),
      {
        response: { 200: ModelTrafficDetailSchema, 400: RouterError, 404: RouterError },
        detail: { tags, summary: 'Traffic statistics of one model', parameters: [modelParam, windowParam] },
      },
    )
    .get('/sleep/status', () => service.sleepStatus(), {
      response: SleepStatusSchema,
      detail: {
        tags,
        summary: 'Sleep state of every model',
        description:
          'active: {status, last_activity}; sleeping and waking: {status, sleep_time, sleep_duration, sleep_level}. ' +
          'A gateway model served on demand that has no engine now is not asleep: unloaded (catalogued, no ' +
          'instance; a request loads it) or loading (its instance is starting), each {status, last_activity}.',
      },
    })
    .get('/sleep/candidates', () => service.sleepCandidates(), {
      response: SleepCandidatesSchema,
      detail: {
        tags,
        summary: 'Models auto-sleep would put to sleep now',
        description:
          'Active, idle for at least auto_sleep.idle_threshold, no request in flight, no operation under way, ' +
          'sleep mode not known to be missing. Listed even when auto-sleep is off.',
      },
    })
    .post(
      '/action/sleep/:model_name',
      guard(async ({ params, set, request }) => {
        const r = await service.sleepAction(params.model_name!, request.headers.get('authorization'))
        set.status = r.httpStatus
        return r.body
      }),
      {
        response: {
          200: ActionResultSchema,
          ...authError,
          404: RouterError,
          409: ActionResultSchema,
          502: ActionResultSchema,
        },
        detail: {
          tags,
          summary: 'Put a model to sleep (engine POST /sleep?level=auto_sleep.level)',
          description:
            'Body: empty or {}; a field in it is refused (400 `invalid_request`): the action takes none. The model stops taking requests and its requests in flight finish ' +
            'first (drain; the engine is asked with mode=wait): a sleep never cuts a stream. Refusals answer 409 ' +
            'with the error result: already sleeping, going to sleep, waking up, not loaded or loading, no sleep mode, requests still in ' +
            'flight at control_timeout, or a request that arrived during the drain (the model is in use). 502 ' +
            'when the engine does not answer. ' +
            ACTION_KEY_RULE,
          parameters: [modelParam],
        },
      },
    )
    .post(
      '/action/wakeup/:model_name',
      guard(async ({ params, set, request }) => {
        const r = await service.wakeAction(params.model_name!, request.headers.get('authorization'))
        set.status = r.httpStatus
        return r.body
      }),
      {
        response: {
          200: ActionResultSchema,
          ...authError,
          404: RouterError,
          409: ActionResultSchema,
          502: ActionResultSchema,
        },
        detail: {
          tags,
          summary: 'Wake a sleeping model (engine POST /wake_up); answers once it is awake',
          description:
            'Body: empty or {}; a field in it is refused (400 `invalid_request`). 409 with the error result when the model is already active, already ' +
            'waking, not loaded or loading (a request loads it), or has slept less than auto_sleep.min_sleep_duration (then with min_sleep_duration and ' +
            'actual_sleep_duration in seconds). 502 when the engine does not answer. ' +
            ACTION_KEY_RULE,
          parameters: [modelParam],
        },
      },
    )
    .get('/health', () => service.health(), {
      response: HealthSchema,
      detail: {
        tags,
        summary: 'Router health',
        description:
          '`models_sleeping` counts waking models too; an unloaded or loading gateway model counts in neither.',
      },
    })
    .get(
      '/health/:model_name',
      guard(({ params }) => service.modelHealth(params.model_name!)),
      {
        response: { 200: ModelHealthSchema, 404: RouterError },
        detail: {
          tags,
          summary: "Probe one model's engine /health (deadline: health_timeout_ms)",
          description:
            'Always 200 for a known model: the body says healthy (with response_time) or unhealthy (with error).',
          parameters: [modelParam],
        },
      },
    )
    .get('/get_server_info', () => service.serverInfo(), {
      response: ServerInfoSchema,
      detail: { tags, summary: 'modelgate version and controller name' },
    })
    .all(
      '*',
      ({ request }) => routeNotFound(request.method, new URL(request.url).pathname).toResponse('proxy'),
      {
        parse: 'none',
        detail: { hide: true },
      },
    )
}
