import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Value } from '@sinclair/typebox/value'
import type { Server } from 'bun'
import type { Registry } from 'prom-client'
import type { LoadedConfig } from '../config/load.ts'
import { dashboardPages, pageAddresses } from '../dashboard/pages.ts'
import { dashboardRoutes } from '../dashboard/routes.ts'
import { ModelDirectory } from '../directory/directory.ts'
import { createBaseApp, renderError, shapeFor } from '../http/app.ts'
import { AuthService } from '../http/auth.ts'
import { coreRoutes } from '../http/core-routes.ts'
import { inferenceAuthorization } from '../http/credentials.ts'
import { docsPlugin } from '../http/docs.ts'
import { type ErrorShape, inferenceShape } from '../http/errors.ts'
import { keysRoutes } from '../http/keys/routes.ts'
import { splitUrl } from '../http/url.ts'
import { CORE_OWNER, coreMigrations } from '../store/core/migrations.ts'
import { applyMigrations, openStore, type Store } from '../store/db.ts'
import { WireFront } from '../wire/server.ts'
import { abortable, WaitError } from './abortable.ts'
import { AccessLog } from './access-log.ts'
import { EventBus } from './bus.ts'
import { connectionCap } from './limits.ts'
import { listenError } from './listen-error.ts'
import { Logger } from './logger.ts'
import { createMetricsRegistry } from './metrics.ts'
import type {
  AnyElysia,
  ListenerSpec,
  PluginContext,
  PluginDefinition,
  PluginInstance,
  RawRoute,
} from './plugin.ts'
import { orderPlugins } from './registry.ts'
import { Telemetry } from './telemetry/telemetry.ts'
import { CertFiles, selfTrust } from './tls.ts'

/**
 * Host boots modelgate from a validated config: store and migrations → plugins set up in
 * dependency order → routes mounted → listeners opened → plugins started. `shutdown` undoes it in
 * reverse under one deadline. A failing setup or start stops whatever was already prepared.
 */
export interface HostOptions {
  config: LoadedConfig
  definitions: readonly PluginDefinition[]
  version: string
  selfCommand: readonly string[]
  logger?: Logger
}

interface Running {
  def: PluginDefinition
  instance: PluginInstance
}

export class Host {
  readonly log: Logger
  readonly bus = new EventBus()
  readonly metrics: Registry
  readonly auth: AuthService
  /** directory: where every listener's inference requests go (src/directory), fed by the plugins. */
  readonly directory: ModelDirectory
  /** telemetry: traces over OTLP (`telemetry:`), set up first in boot; OFF until then and when not configured. */
  telemetry: Telemetry = Telemetry.OFF
  private store: Store | null = null
  private readonly running: Running[] = []
  private readonly servers: { name: string; server: Server<unknown>; front: WireFront }[] = []
  /** Private directory of the frameworks' Unix sockets (behind each listener's wire front). */
  private socketDir: string | null = null
  /** tls: the certificate every listener presents (`server.tls`), null when plain HTTP; set first in boot. */
  private tls: CertFiles | null = null
  private started = false
  private stopping: Promise<void> | null = null
  private readonly startedAt = Date.now()

  constructor(private readonly opts: HostOptions) {
    const { root } = opts.config
    this.log = opts.logger ?? new Logger(root.log.level, 'modelgate', root.log.format)
    this.metrics = createMetricsRegistry()
    this.auth = new AuthService({ ...root.auth, logins_per_minute: root.server.login_attempts_per_minute })
    this.directory = new ModelDirectory(this.bus, this.log.child('directory'), this.metrics)
    this.auth.useLog(this.log.child('auth'))
    this.auth.keys.useMetrics(this.metrics)
  }

  /** fronts: each listener's front by name (its connections and the bodies it holds: tests, metrics). */
  get fronts(): Record<string, WireFront> {
    return Object.fromEntries(this.servers.map((s) => [s.name, s.front]))
  }

  /** urls lists where each listener serves (https: with `server.tls`), for the start-up banner and tests. */
  get urls(): Record<string, string> {
    return Object.fromEntries(this.servers.map((s) => [s.name, this.urlOf(s.front)]))
  }

  private urlOf(front: WireFront): string {
    const host = front.hostname.includes(':') ? `[${front.hostname}]` : front.hostname
    return `${this.tls ? 'https' : 'http'}://${host}:${front.port}`
  }

  /**
   * selfCa: with `server.tls`, the certificate (PEM) the listeners present now, for calls this
   * process makes to its own listeners to trust (fetch's `tls: { ca }`, Pool's `ca`); null without TLS.
   */
  get selfCa(): string | null {
    return this.tls?.files.cert ?? null
  }

  get ready(): boolean {
    return this.started && !this.stopping
  }

  api<T>(id: string): T {
    const r = this.running.find((x) => x.def.id === id)
    if (!r?.instance.api) throw new Error(`plugin '${id}' has no api (not enabled, or not set up yet)`)
    return r.instance.api as T
  }

  async boot(): Promise<void> {
    const { config, definitions } = this.opts
    const root = config.root
    // The certificate first: a missing or bad one stops start-up before anything is opened.
    if (root.server.tls) {
      this.tls = new CertFiles(root.server.tls.cert_file, root.server.tls.key_file, this.log.child('tls'))
      this.tls.subscribe((files) => {
        for (const s of this.servers) s.front.useTls(files, this.log)
      })
    }
    this.telemetry = await Telemetry.start(root.telemetry, {
      version: this.opts.version,
      log: this.log.child('telemetry'),
    })
    this.store = openStore(root.data_dir)
    const order = orderPlugins(definitions, new Set(config.plugins.keys()))
    try {
      applyMigrations(this.store, CORE_OWNER, coreMigrations)
      this.auth.useStore(this.store, this.bus)
      this.auth.oauth?.useStore(this.store)
      for (const def of order) {
        applyMigrations(this.store, def.id, def.migrations ?? [])
        const cfg = config.plugins.get(def.id) ?? Value.Default(def.config, {})
        const instance = await def.setup(this.context(def), cfg as never)
        this.running.push({ def, instance })
      }
      this.listen(order)
      this.tls?.watch()
      for (const r of this.running) await r.instance.start?.()
      this.started = true
    } catch (err) {
      await this.shutdown('boot failure').catch(() => {})
      throw err
    }
  }

  private context(def: PluginDefinition): PluginContext {
    const deps = new Set(def.dependsOn ?? [])
    const { root } = this.opts.config
    return {
      config: root,
      bus: this.bus,
      log: this.log.child(def.id),
      store: this.store!,
      metrics: this.metrics,
      auth: this.auth,
      directory: this.directory,
      telemetry: this.telemetry,
      dataDir: root.data_dir,
      configFile: this.opts.config.file ?? null,
      version: this.opts.version,
      selfCommand: this.opts.selfCommand,
      api: <T>(id: string): T => {
        if (!deps.has(id)) throw new Error(`plugin '${def.id}' must list '${id}' in dependsOn to use its api`)
        return this.api<T>(id)
      },
      mainUrl: () => {
        const url = this.urls.main
        if (!url) throw new Error('the main listener is not open yet')
        return url
      },
      selfTls: () => {
        const main = this.servers.find((s) => s.name === 'main')
        return this.tls && main ? selfTrust(this.tls.files.cert, main.front.hostname) : null
      },
      has: (id) => this.opts.config.plugins.has(id),
      optionalApi: <T>(id: string): T | undefined =>
        this.running.find((x) => x.def.id === id)?.instance.api as T | undefined,
    }
  }

  private mainApp(order: PluginDefinition[]): AnyElysia {
    const tags = [
      { name: 'health', description: 'Liveness and readiness (public)' },
      { name: 'auth', description: 'Login and current user (public)' },
      { name: 'metrics', description: 'Prometheus metrics' },
      { name: 'keys', description: 'Inference keys: limits, budgets and usage' },
      { name: 'dashboard', description: 'The web dashboard, which every plugin feeds' },
      ...order.map((d) => ({ name: d.id, description: d.description })),
    ]
    let app: AnyElysia = createBaseApp({
      name: 'main',
      auth: this.auth,
      log: this.log,
      // A typed dashboard address (`/models`) opens its page (`/#/models`) where no route serves it.
      fallback: pageAddresses(this.opts.definitions),
    })
      .use(
        docsPlugin({
          title: 'modelgate',
          description:
            'Gateway for vLLM engines on GPU hosts. Admin routes take the admin JWT when AUTH_MODE is not none; ' +
            'inference routes take the inference API key when INFERENCE_API_KEY is set.',
          version: this.opts.version,
          tags,
          access: (method, pattern) => this.auth.access(method, pattern),
        }),
      )
      .use(
        coreRoutes({
          auth: this.auth,
          metrics: this.metrics,
          version: this.opts.version,
          startedAt: this.startedAt,
          ready: () => this.ready,
          plugins: () => this.running.map((r) => r.def.id),
        }),
      )
      .use(keysRoutes(this.auth.keys))
      .use(this.dashboard())
    for (const r of this.running) if (r.instance.routes) app = app.use(r.instance.routes)
    // The guard authorises the matched route by its own declaration (src/http/auth.ts).
    this.auth.declareRoutes(app.routes)
    return app
  }

  /** dashboard: the host's dashboard, with the pages and live feeds of the plugins that are on. */
  private dashboard(): AnyElysia {
    const { definitions, config } = this.opts
    return dashboardRoutes({
      log: this.log.child('dashboard'),
      clients: definitions.flatMap((d) => (d.dashboard ? [d.dashboard.client] : [])),
      pages: () => dashboardPages(definitions, (id) => config.plugins.has(id)),
      live: {
        bus: this.bus,
        feeds: () =>
          this.running.map((r) => ({ events: r.def.dashboard?.events ?? [], live: r.instance.live })),
      },
      inferenceKey: () => this.auth.ownInferenceKey(),
    })
  }

  private listen(order: PluginDefinition[]): void {
    const { root } = this.opts.config
    const raw = this.running.flatMap((r) => r.instance.rawRoutes ?? [])
    // The main listener's hot routes are inference routes: the inference key is checked on them.
    // It alone serves the cluster's signed /internal/* routes: its front vets them.
    this.serve('main', root.server.host, root.server.port, this.mainApp(order), raw, {
      inferenceKey: true,
      internal: true,
    })
    for (const r of this.running) {
      for (const l of r.instance.listeners ?? [])
        this.serve(l.name, l.host, l.port, this.listenerApp(l), l.rawRoutes ?? [], {
          inferenceKey: l.inferenceKey ?? false,
          ...(l.errorShape ? { shape: l.errorShape } : {}),
        })
    }
  }

  private listenerApp(l: ListenerSpec): AnyElysia {
    return createBaseApp({
      name: l.name,
      auth: null,
      log: this.log,
      ...(l.errorShape ? { shape: l.errorShape } : {}),
    })
      .use(
        docsPlugin({
          title: l.title,
          description: l.description,
          version: this.opts.version,
          tags: [],
        }),
      )
      .use(l.app)
  }

  /**
   * serve opens one listener: the wire front on the public port (src/wire/server.ts), which
   * answers hot routes itself (checking the inference key on them when `inferenceKey`; the cluster
   * signature on every `/internal/*` request when `internal`) and relays everything else to the framework (Bun.serve + Elysia) listening on a Unix socket in a private
   * directory.
   */
  private serve(
    name: string,
    host: string,
    port: number,
    app: AnyElysia,
    raw: RawRoute[],
    opts: { inferenceKey: boolean; internal?: boolean; shape?: ErrorShape },
  ): void {
    const shape = opts.shape
    const log = this.log
    const auth = this.auth
    const srv = this.opts.config.root.server
    const idleTimeout = srv.idle_timeout_seconds
    const handle = app.fetch as (req: Request) => Response | Promise<Response>
    const access = new AccessLog(log, name)
    this.socketDir ??= mkdtempSync(join(tmpdir(), 'modelgate-'))
    const socket = join(this.socketDir, `${name}.sock`)
    const server = Bun.serve({
      // The front owns client connections and their idle timeout. Bun's own (10 s) applies on Unix
      // sockets too, though its types leave it out there, and would cut an event stream between heartbeats.
      unix: socket,
      ...({ idleTimeout: 0 } as object),
      fetch: async (req) => {
        const started = performance.now()
        let res: Response
        // HEAD is answered by the GET handler, its body dropped here (headOnly): Elysia's own HEAD
        // reads the GET response whole to measure it, which never ends for an event stream.
        const head = req.method === 'HEAD'
        try {
          res = await handle(head ? new Request(req.url, { headers: req.headers, signal: req.signal }) : req)
        } catch (err) {
          res = renderError(err, new URL(req.url).pathname, log, shape)
        }
        const { path, query } = splitUrl(req.url)
        access.request(req.method, path, query, res.status, performance.now() - started)
        return head ? headOnly(res) : res
      },
      error(err) {
        return renderError(err, '/', log, shape)
      },
    })
    let front: WireFront
    try {
      front = new WireFront({
        name,
        hostname: host,
        port,
        idleTimeoutSeconds: idleTimeout,
        ...(this.tls ? { tls: this.tls.files } : {}),
        routes: raw,
        front: {
          headTimeoutMs: srv.request_head_timeout_seconds * 1000,
          minBodyBytesPerSecond: srv.min_body_bytes_per_second,
          maxConnections: srv.max_connections || connectionCap(),
          maxConnectionsPerAddress: srv.max_connections_per_address,
          maxBufferedBodyBytes: srv.max_buffered_body_bytes,
          relayBodyBytes: srv.max_admin_body_bytes,
          maxJsonDepth: srv.max_json_depth,
        },
        ...(opts.inferenceKey ? { guard: (req) => auth.admitInference(inferenceAuthorization(req)) } : {}),
        ...(opts.internal ? { internal: (req) => auth.vetInternal(req) } : {}),
        ...(opts.internal ? { internalHead: (req) => auth.internalHead(req) } : {}),
        frameworkSocket: socket,
        telemetry: this.telemetry,
        shapeOf: (path) => (shape === 'proxy' ? inferenceShape(path) : (shape ?? shapeFor(path))),
        onRequest: (method, path, query, status, ms, refused) =>
          access.request(method, path, query, status, ms, refused),
      })
    } catch (err) {
      server.stop(true)
      throw listenError(name, host, port, err)
    }
    this.servers.push({ name, server, front })
    const url = this.urlOf(front)
    log.info(`${name} listening`, { url, docs: `${url}/docs` })
  }

  /**
   * shutdown stops accepting, lets running inference requests (streams included) finish for up to
   * `shutdown.drain_ms`, then stops plugins in reverse order (the gateway stops its engines), all
   * under one deadline (`shutdown.timeout_ms`), then closes the store.
   */
  shutdown(reason: string): Promise<void> {
    if (this.stopping) return this.stopping
    this.stopping = (async () => {
      const { timeout_ms: budget, drain_ms } = this.opts.config.root.shutdown
      const deadline = AbortSignal.timeout(budget)
      this.log.info('shutting down', { reason, budget_ms: budget })
      this.tls?.stop()
      for (const s of this.servers) s.front.stop(false)
      // Requests queued for a model's load are answered now (503): nothing loads during a shutdown.
      this.directory.stopQueues()
      // The drain never takes the last STOP_RESERVE_MS of the budget: engines need it to stop.
      await this.drain(Math.min(drain_ms, Math.max(0, budget - STOP_RESERVE_MS)), deadline)
      // What is still held for a wake past the drain is answered now (503), not when its engine stops.
      this.directory.stop()
      for (const r of [...this.running].reverse()) {
        try {
          await abortable(Promise.resolve(r.instance.stop?.(deadline)), { signal: deadline })
        } catch (err) {
          const error =
            err instanceof WaitError && deadline.aborted ? 'shutdown deadline passed' : String(err)
          this.log.error(`plugin ${r.def.id} did not stop cleanly`, { error })
          r.instance.kill?.()
        }
      }
      for (const s of this.servers) {
        s.front.stop(true)
        s.server.stop(true)
      }
      if (this.socketDir) rmSync(this.socketDir, { recursive: true, force: true })
      // Spans of the shutdown itself (engines unloaded) are queued by now: send them, within the budget.
      await abortable(this.telemetry.shutdown(), { signal: deadline }).catch((err) =>
        this.log.warn('traces not flushed at shutdown', { error: String(err) }),
      )
      // The last second of the inference keys' usage, written before the store closes.
      try {
        this.auth.keys.stop()
      } catch (err) {
        this.log.error('usage of inference keys not written at shutdown', { error: String(err) })
      }
      this.store?.close()
      this.log.info('stopped')
    })()
    return this.stopping
  }

  /** drain waits for the listeners' running inference requests, for up to `ms`. */
  private async drain(ms: number, deadline: AbortSignal): Promise<void> {
    const running = () => this.servers.reduce((n, s) => n + s.front.running, 0)
    if (running() === 0 || ms === 0) return
    this.log.info('draining running requests', { running: running(), drain_ms: ms })
    try {
      await abortable(Promise.all(this.servers.map((s) => s.front.drained())), {
        signal: deadline,
        timeoutMs: ms,
      })
    } catch {
      this.log.warn('drain ended with requests still running; they are cut', { running: running() })
    }
  }

  /** kill is the forced exit path (second signal): synchronous last-resort cleanup of children. */
  kill(): void {
    for (const r of [...this.running].reverse()) {
      try {
        r.instance.kill?.()
      } catch {
        // best effort
      }
    }
  }
}

/** Of the shutdown budget, what the drain leaves for stopping plugins (engines: TERM, wait, KILL). */
const STOP_RESERVE_MS = 5000

/** headOnly: the answer to a HEAD request, the GET handler's status and headers; its body is cancelled. */
function headOnly(res: Response): Response {
  if (res.body === null) return res
  void res.body.cancel().catch(() => {})
  return new Response(null, { status: res.status, statusText: res.statusText, headers: res.headers })
}
