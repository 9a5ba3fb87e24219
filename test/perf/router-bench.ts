import router from '../../plugins/router/index.ts'
import type { Host } from '../../src/host/host.ts'
import type { PluginDefinition } from '../../src/host/plugin.ts'
import { startHost } from '../support/host.ts'

/**
 * startRouterForBench boots a real Host running only the router plugin, routing one model name
 * (default `bench-model`, the name test/perf/proxy-server.ts serves) to one upstream engine, with
 * traffic statistics on (they always are) and auto-sleep off. The proxy benchmark can import it to
 * add the router's /v1 path to its table beside the gateway's; test/perf/router-server.ts runs it
 * in its own process.
 */
export interface RouterBenchOptions {
  upstreamPort: number
  upstreamHost?: string
  model?: string
  /** keep-alive idle timeout of the listener (server.idle_timeout_seconds) */
  idleTimeoutSeconds?: number
  logSink?: (line: string) => void
}

export interface RouterBench {
  /** the router listener's base URL (POST `${url}/v1/chat/completions`) */
  url: string
  host: Host
  stop(): Promise<void>
}

export async function startRouterForBench(o: RouterBenchOptions): Promise<RouterBench> {
  const yaml = `
log: { level: warn }
plugins:
  router:
    host: 127.0.0.1
    port: 0
    from_gateway: false
    models:
      - { name: ${JSON.stringify(o.model ?? 'bench-model')}, endpoint: { host: ${o.upstreamHost ?? '127.0.0.1'}, port: ${o.upstreamPort} } }
`
  const th = await startHost(yaml, [router as unknown as PluginDefinition], {}, undefined, {
    server: { idle_timeout_seconds: o.idleTimeoutSeconds ?? 120 },
    logLevel: 'warn',
    ...(o.logSink ? { logSink: o.logSink } : {}),
  })
  return { url: th.host.urls.router!, host: th.host, stop: th.stop }
}
