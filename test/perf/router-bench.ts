import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import router from '../../plugins/router/index.ts'
import { knownPlugins } from '../../src/config/file.ts'
import { loadConfig } from '../../src/config/load.ts'
import { Host } from '../../src/host/host.ts'
import { Logger } from '../../src/host/logger.ts'
import type { PluginDefinition } from '../../src/host/plugin.ts'

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
  const dataDir = mkdtempSync(join(tmpdir(), 'modelgate-router-bench-'))
  const idle = o.idleTimeoutSeconds ?? 120
  const yaml = `
data_dir: ${dataDir}
server: { host: 127.0.0.1, port: 0, idle_timeout_seconds: ${idle} }
log: { level: warn }
plugins:
  router:
    host: 127.0.0.1
    port: 0
    from_gateway: false
    models:
      - { name: ${JSON.stringify(o.model ?? 'bench-model')}, endpoint: { host: ${o.upstreamHost ?? '127.0.0.1'}, port: ${o.upstreamPort} } }
`
  const defs = [router as unknown as PluginDefinition]
  const config = loadConfig(yaml, {}, knownPlugins(defs))
  const logs: string[] = []
  const host = new Host({
    config,
    definitions: defs,
    version: '0.0.0-bench',
    selfCommand: [process.execPath],
    logger: new Logger('warn', 'bench', 'text', o.logSink ?? ((l) => logs.push(l))),
  })
  await host.boot()
  return {
    url: host.urls.router!,
    host,
    async stop() {
      await host.shutdown('bench')
      rmSync(dataDir, { recursive: true, force: true })
    },
  }
}
