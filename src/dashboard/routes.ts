import { Elysia, t } from 'elysia'
import type { Logger } from '../host/logger.ts'
import { AppError, notFound } from '../http/errors.ts'
import { pageHeaders } from '../http/page-headers.ts'
import { ControllerError } from '../http/schemas.ts'
import { type DashboardFile, loadBundle } from './bundle.ts'
import { type LiveSource, liveStream } from './live.ts'
import { DashboardPagesSchema, InferenceKey } from './schemas.ts'

export { InferenceKey }

/**
 * dashboardRoutes serve the web dashboard, which is the host's and every plugin feeds: the page at
 * `/` and its hashed assets (public: they hold no secret; every API call the page makes carries the
 * JWT), the one live stream (either role), the pages of the plugins that are on, and the inference
 * key for the chat playground (admin only).
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

/** DashboardDeps: what the dashboard's routes read from the host. */
export interface DashboardDeps {
  log: Logger
  /** clients: every compiled-in plugin's client module, bundled into the page (from source). */
  clients: readonly string[]
  /** pages: the pages of the plugins that are on, and those of the ones that are off. */
  pages(): typeof DashboardPagesSchema.static
  live: LiveSource
  inferenceKey(): string | null
}

export function dashboardRoutes(deps: DashboardDeps) {
  let bundle: Promise<Map<string, Served>> | null = null
  /** files: the bundle, built (from source) or read (compiled) on first use; a failure is retried. */
  const files = async () => {
    bundle ??= loadBundle(deps.clients).then(serveFrom)
    try {
      return await bundle
    } catch (err) {
      bundle = null
      deps.log.error('dashboard unavailable', { error: err instanceof Error ? err.message : String(err) })
      throw new AppError(503, 'DASHBOARD_UNAVAILABLE', 'The dashboard could not be built; the log says why')
    }
  }
  const tags = ['dashboard']
  return new Elysia({ name: 'dashboard' })
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
            'A single page every plugin contributes to (GPUs, models, chat, …). It loads only its own hashed assets from `/assets/` and talks only ' +
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
    .get('/api/dashboard/events', ({ request }) => liveStream(deps.live, request.signal), {
      detail: {
        tags,
        summary: "The dashboard's live stream (SSE), which every plugin feeds",
        description:
          'One stream for the whole page: each plugin that is on sends its current state first, then its ' +
          'changes as they happen. The gateway: first `instances` {instances: [instance records]}, then: `instance` ' +
          '{instance, previousStatus, currentStatus, message} on every state change (currentStatus `removed`: gone); ' +
          '`progress` {instance_id, phase, percent, message} from each instance (load, wake); `operation` ' +
          '{instance_id, operation: sleep|wake|move, running}; `move` (the move_progress record); `traffic` ' +
          '{requests} at most every 2 s while proxied requests end; `timeseries` (the last hour, as ' +
          '`GET /api/dashboard/timeseries` answers it) once after `instances`, then `sample` {t, values} every 5 s; ' +
          '`catalog` {change: saved, entry, created | change: removed, name} when a catalogue entry is saved or removed; ' +
          '`residency` (a decision, as GET /api/residency lists them) when the residency manager makes room. ' +
          'The router: `router.changed` (as `GET /api/dashboard/router` answers) at most every second while its ' +
          'models, traffic or sleep states change. The cluster: `cluster.changed` {status, pods, table} (as ' +
          '`GET /api/cluster`, `/api/cluster/pods` and `/api/cluster/routing-table` answer) when what this pod ' +
          'knows of the cluster changes (a heartbeat heard, a pod silent, a new table or leader). ' +
          'Heartbeat comments every 15 s.',
      },
    })
    .get('/api/dashboard/pages', () => deps.pages(), {
      response: { 200: DashboardPagesSchema, 401: ControllerError },
      detail: {
        tags,
        summary: 'The dashboard’s pages: those of the plugins that are on, for its navigation',
        description:
          '200: {pages: [{plugin, id, title, path, nav}] in navigation order (each plugin’s in the plugin ' +
          'order, then the host’s own), off: [{plugin, path}] the pages of compiled-in plugins that are off ' +
          '(the page says so at their address)}.',
        'x-required-role': 'admin-readonly',
      },
    })
    .get(
      '/api/dashboard/inference-key',
      ({ set }) => {
        set.headers['cache-control'] = 'no-store'
        const key = deps.inferenceKey()
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
            'model), which a read-only role must not obtain, so its dashboard shows no chat. `key` is INFERENCE_API_KEY; ' +
            'while keys made through /api/keys are in force without it, a key this process made at start-up for its ' +
            'own clients (held in memory only, no limits, usage counted as `static`); null while inference is open. ' +
            'Never cached (`no-store`). Kept under /api/dashboard, not /api/auth, which is public.',
          'x-required-role': 'admin',
        },
      },
    )
}
