import { Elysia, t } from 'elysia'
import type { PluginContext } from '../../../src/host/plugin.ts'
import { AppError, notFound } from '../../../src/http/errors.ts'
import { pageHeaders } from '../../../src/http/page-headers.ts'
import { ControllerError } from '../../../src/http/schemas.ts'
import type { GatewayService } from '../service.ts'
import { SAMPLE_INTERVAL_MS, SAMPLES_KEPT } from '../timeseries/ring.ts'
import type { TimeSeriesSampler } from '../timeseries/sampler.ts'
import { type DashboardFile, loadBundle } from './bundle.ts'
import { dashboardEvents } from './events.ts'

/**
 * dashboardRoutes serve the web dashboard: the page at `/` and its hashed assets (public: they hold
 * no secret; every API call the page makes carries the JWT), the page's event stream (either role)
 * and the inference key for its chat playground (admin only).
 *
 * The page may load nothing from any other host and run no inline script: its Content-Security-Policy
 * allows only this origin (`default-src 'self'`, `connect-src 'self'`), and the bundle carries its own
 * code and styles. Assets are named by their content hash, so they are cached for a year; the page
 * itself is revalidated (ETag) on every load, so a new binary's page names the new assets at once.
 */
export const DASHBOARD_CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "font-src 'self'",
  "connect-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ')

/** The page's headers: its CSP, no framing (also X-Frame-Options), nosniff, no Referer, its own opener group. */
const PAGE_HEADERS = pageHeaders(DASHBOARD_CSP)

/** InferenceKey: the key route's answer. */
export const InferenceKey = t.Object({
  required: t.Boolean({ description: 'INFERENCE_API_KEY is set: /v1 needs the key' }),
  key: t.Nullable(t.String()),
})

interface Served {
  type: string
  bytes: Uint8Array<ArrayBuffer>
  gzipped: Uint8Array<ArrayBuffer>
  etag: string
}

/** serveFrom indexes the bundle's files by name, each with its gzipped copy (compressed once). */
function serveFrom(files: DashboardFile[]): Map<string, Served> {
  const out = new Map<string, Served>()
  for (const f of files) {
    const etag = `"${Bun.hash(f.bytes).toString(36)}"`
    out.set(f.name, { type: f.type, bytes: f.bytes, gzipped: Bun.gzipSync(f.bytes), etag })
  }
  return out
}

function respond(req: Request, file: Served, headers: Record<string, string>): Response {
  const common = { ...headers, etag: file.etag, vary: 'accept-encoding', 'content-type': file.type }
  if (req.headers.get('if-none-match') === file.etag)
    return new Response(null, { status: 304, headers: common })
  const gzip = /\bgzip\b/.test(req.headers.get('accept-encoding') ?? '')
  return gzip
    ? new Response(file.gzipped, { headers: { ...common, 'content-encoding': 'gzip' } })
    : new Response(file.bytes, { headers: common })
}

/** FEATURES: the optional plugins the dashboard has pages for. */
export const FEATURES = ['benchmarks', 'router', 'cluster'] as const
export const Features = t.Object({
  plugins: t.Array(t.Union([t.Literal('benchmarks'), t.Literal('router'), t.Literal('cluster')])),
})

/** TimeSeriesBody: the time-series route's answer (the ring, oldest first). */
export const TimeSeriesBody = t.Object({
  interval_ms: t.Integer({ description: 'time between samples' }),
  t: t.Array(t.Number(), { description: 'when each sample was taken (Unix ms)' }),
  series: t.Record(t.String(), t.Array(t.Nullable(t.Number())), {
    description: 'values by series name, one per sample (null: no value then)',
  }),
})

export function dashboardRoutes(ctx: PluginContext, service: GatewayService, timeseries: TimeSeriesSampler) {
  let bundle: Promise<Map<string, Served>> | null = null
  /** files: the bundle, built (from source) or read (compiled) on first use; a failure is retried. */
  const files = async () => {
    bundle ??= loadBundle().then(serveFrom)
    try {
      return await bundle
    } catch (err) {
      bundle = null
      ctx.log.error('dashboard unavailable', { error: err instanceof Error ? err.message : String(err) })
      throw new AppError(503, 'DASHBOARD_UNAVAILABLE', 'The dashboard could not be built; the log says why')
    }
  }
  const source = {
    bus: ctx.bus,
    list: () => service.list(),
    events: (id: string) => service.instances.get(id)?.events,
    timeseries,
  }
  const tags = ['gateway']
  return new Elysia({ name: 'gateway-dashboard' })
    .get(
      '/',
      async ({ request }) => {
        const index = (await files()).get('index.html')
        if (!index) throw new AppError(503, 'DASHBOARD_UNAVAILABLE', 'The dashboard bundle has no page')
        return respond(request, index, { ...PAGE_HEADERS, 'cache-control': 'no-cache' })
      },
      {
        detail: {
          tags,
          summary: 'The web dashboard (public page; its API calls carry the JWT)',
          description:
            'A single page: GPUs, models, chat. It loads only its own hashed assets from `/assets/` and talks only ' +
            "to this origin (Content-Security-Policy `default-src 'self'`). The JWT lives in the tab's sessionStorage.",
        },
      },
    )
    .get(
      '/assets/:file',
      async ({ params, request }) => {
        const file = params.file === 'index.html' ? undefined : (await files()).get(params.file)
        if (!file) throw notFound(`No dashboard asset '${params.file}'`)
        return respond(request, file, {
          'cache-control': 'public, max-age=31536000, immutable',
          'x-content-type-options': 'nosniff',
        })
      },
      { params: t.Object({ file: t.String() }), detail: { hide: true } },
    )
    .get('/api/dashboard/events', ({ request }) => dashboardEvents(source, request.signal), {
      detail: {
        tags,
        summary: "The dashboard's event stream (SSE)",
        description:
          'One stream for the whole page. First `instances` {instances: [instance records]}, then: `instance` ' +
          '{instance, previousStatus, currentStatus, message} on every state change (currentStatus `removed`: gone); ' +
          '`progress` {instance_id, phase, percent, message} from each instance (load, wake); `operation` ' +
          '{instance_id, operation: sleep|wake|move, running}; `move` (the move_progress record); `traffic` ' +
          '{requests} at most every 2 s while proxied requests end; `timeseries` (the last hour, as ' +
          '`GET /api/dashboard/timeseries` answers it) once after `instances`, then `sample` {t, values} every 5 s; ' +
          '`catalog` {change: saved, entry, created | change: removed, name} when a catalogue entry is saved or removed; ' +
          '`residency` (a decision, as GET /api/residency lists them) when the residency manager makes room. ' +
          'Heartbeat comments every 15 s.',
      },
    })
    .get('/api/dashboard/timeseries', () => timeseries.ring.snapshot(), {
      response: { 200: TimeSeriesBody, 401: ControllerError },
      detail: {
        tags,
        summary:
          'The last hour of traffic, latency, tokens, KV-cache use and GPU memory (what the dashboard draws)',
        description:
          `One sample every ${SAMPLE_INTERVAL_MS / 1000} s, the last ${SAMPLES_KEPT} kept in memory (an hour; nothing ` +
          'survives a restart). Series: `requests_per_second`, `errors_per_second` (5xx), `ttft_p50_ms`, `ttft_p99_ms` ' +
          '(time to the first byte of the answer), `tokens_per_second` (output tokens, from the engines), ' +
          '`queued_p99_ms` (requests held for a wake), and per served model `kv_cache_usage/<model>` (0-1) and ' +
          '`gpu_memory_gib/<model>`. The event stream sends the same ring, then each new sample.',
        'x-required-role': 'admin-readonly',
      },
    })
    .get('/api/dashboard/features', () => ({ plugins: FEATURES.filter((id) => ctx.has(id)) }), {
      response: { 200: Features, 401: ControllerError },
      detail: {
        tags,
        summary: 'Which optional plugins are on, for the dashboard’s navigation',
        description:
          `200: {plugins: the ones of ${FEATURES.join(', ')} that are enabled}. The dashboard shows their pages ` +
          'only when on.',
        'x-required-role': 'admin-readonly',
      },
    })
    .get(
      '/api/dashboard/inference-key',
      ({ set }) => {
        set.headers['cache-control'] = 'no-store'
        const key = ctx.config.auth.inference_api_key || null
        return { required: key !== null, key }
      },
      {
        response: { 200: InferenceKey, 401: ControllerError },
        detail: {
          tags,
          summary: "The inference API key, for the dashboard's chat playground (admin only)",
          description:
            'The dashboard of a signed-in admin is given the key automatically, for its chat playground. ' +
            'admin-readonly is refused (403): the key is a credential that changes state (a request wakes a sleeping ' +
            'model), which a read-only role must not obtain, so its dashboard shows no chat. `key` is null when ' +
            'INFERENCE_API_KEY is not set (inference is open). Never cached (`no-store`). Kept under /api/dashboard, ' +
            'not /api/auth, which is public.',
          'x-required-role': 'admin',
        },
      },
    )
}
