import type { Static, TObject } from '@sinclair/typebox'
import type { Elysia } from 'elysia'
import type { Registry } from 'prom-client'
import type { RootConfig } from '../config/schema.ts'
import type { DashboardContribution, LiveFeed } from '../dashboard/contract.ts'
import type { ModelDirectory } from '../directory/directory.ts'
import type { AuthService } from '../http/auth.ts'
import type { Migration, Store } from '../store/db.ts'
import type { EventBus } from './bus.ts'
import type { Logger } from './logger.ts'
import type { Telemetry } from './telemetry/telemetry.ts'

/**
 * The plugin contract. A plugin is a static description (id, config schema, dependencies,
 * migrations) plus a `setup` that prepares a service without side effects (no port, no process).
 * The host mounts the returned routes, opens listeners, then calls `start`; at shutdown it calls
 * `stop` in reverse order under one deadline.
 */
export interface PluginContext {
  readonly config: RootConfig
  readonly bus: EventBus
  readonly log: Logger
  readonly store: Store
  readonly metrics: Registry
  readonly auth: AuthService
  /** directory: the host's model directory; a plugin adds the backends it owns and plans requests on it. */
  readonly directory: ModelDirectory
  /** telemetry: spans of requests and admin operations (src/host/telemetry/); OFF unless configured. */
  readonly telemetry: Telemetry
  readonly dataDir: string
  /** configFile: the YAML file modelgate was started with (absolute), null when not from a file (demo). */
  readonly configFile: string | null
  readonly version: string
  /** selfCommand is the argv prefix that re-runs this modelgate (for `@self` in commands). */
  readonly selfCommand: readonly string[]
  /** mainUrl is the main listener's base URL (valid once listeners are open, i.e. from start()). */
  mainUrl(): string
  /**
   * selfTls: with `server.tls` (mainUrl is https:), how to verify the main listener on calls to it
   * (its certificate as it is now to trust, the name to check; fetch's `tls`, the Pool's options)
   * instead of turning verification off; null without TLS.
   */
  selfTls(): SelfTrust | null
  /** api returns the public api of a plugin listed in `dependsOn`. */
  api<T>(pluginId: string): T
  /** has tells whether a plugin is enabled (for optional cooperation, e.g. router ↔ gateway). */
  has(pluginId: string): boolean
  /** optionalApi returns a plugin's api when it is enabled and already set up, else undefined. */
  optionalApi<T>(pluginId: string): T | undefined
}

/** SelfTrust (src/host/tls.ts selfTrust): how a client in this process verifies its own listener (fetch's `tls`, Pool's options). */
export interface SelfTrust {
  /** ca: the listener's certificate (and, when a CA issued it, the system's roots: the file may lack its root). */
  ca: string[]
  /**
   * serverName: the name to check the certificate against when it does not name the address
   * called (a public certificate for modelgate.example.com, called on 127.0.0.1 or 0.0.0.0).
   */
  serverName?: string
}

// biome-ignore lint/suspicious/noExplicitAny: Elysia instances differ in their generic state
export type AnyElysia = Elysia<any, any, any, any, any, any, any>

/** Listener is an extra port a plugin serves (e.g. the router's own controller port). */
export interface ListenerSpec {
  name: string
  host: string
  port: number
  app: AnyElysia
  /**
   * inferenceKey: the listener's hot routes need the inference key (INFERENCE_API_KEY) as the main
   * listener's do; default false (the listener's routes decide, as the router does per model).
   */
  inferenceKey?: boolean
  /** errorShape fixes the error shape of every response on this listener (default: by path). */
  errorShape?: import('../http/errors.ts').ErrorShape
  /** rawRoutes are this listener's hot routes, answered on its front (documented in `app`). */
  rawRoutes?: RawRoute[]
  title: string
  description: string
}

/**
 * RawRoute is a hot route: matched on the exact path by the listener's front and answered there,
 * socket to socket, without Request or Response objects (src/wire/route.ts). A plugin also
 * declares it in its Elysia routes for /docs; the framework never serves it.
 */
export type RawRoute = import('../wire/route.ts').WireRoute

export interface PluginInstance<Api = unknown> {
  /** routes are mounted on the main listener. */
  routes?: AnyElysia
  /** rawRoutes are the main listener's hot routes, answered on its front (document them in routes). */
  rawRoutes?: RawRoute[]
  listeners?: ListenerSpec[]
  api?: Api
  start?(): void | Promise<void>
  /** stop must be safe even if start never ran; `deadline` aborts when the shutdown budget is spent. */
  stop?(deadline: AbortSignal): void | Promise<void>
  /**
   * live: this plugin's part of each connection to the dashboard's live stream beyond the bus events
   * its definition names (`dashboard.events`): its current state first, events derived per client.
   */
  live?: LiveFeed
  /** kill is the synchronous last resort on a forced exit (second signal): kill child processes. */
  kill?(): void
}

/** ValidateContext: what a plugin's `validate` may read beside its own section. */
export interface ValidateContext {
  /** root: the host's part of the YAML, defaults applied (e.g. `auth.cluster_secret`, `server.port`). */
  readonly root: RootConfig
  /** env: the environment the config was loaded with (defaults such as POD_NAME come from it). */
  readonly env: Readonly<Record<string, string | undefined>>
}

export interface PluginDefinition<S extends TObject = TObject, Api = unknown> {
  id: string
  description: string
  dependsOn?: string[]
  config: S
  /**
   * validate finds what the schema cannot: rules across keys (a range's ends, a key another key's
   * value requires) and against the host's config. It answers one problem per entry, each starting
   * with its dotted path (`plugins.cluster.coordination.static.leader: …`). The config loader runs
   * it once the section passed its schema, so `check-config` and start-up refuse the same
   * configurations, with exit 2, before anything opens. `setup` may then take them as valid.
   */
  validate?(cfg: Static<S>, ctx: ValidateContext): string[]
  migrations?: Migration[]
  /** dashboard: the pages this plugin adds to the host's dashboard and the events it publishes for them. */
  dashboard?: DashboardContribution
  setup(ctx: PluginContext, cfg: Static<S>): PluginInstance<Api> | Promise<PluginInstance<Api>>
}

/** definePlugin keeps the config type flowing from the schema into setup. */
export function definePlugin<S extends TObject, Api>(
  def: PluginDefinition<S, Api>,
): PluginDefinition<S, Api> {
  return def
}
