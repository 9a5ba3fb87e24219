import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { knownPlugins, loadConfigFile } from '../../src/config/file.ts'
import { loadConfig } from '../../src/config/load.ts'
import { Host } from '../../src/host/host.ts'
import { Logger, type LogLevel, type LogSink } from '../../src/host/logger.ts'
import type { PluginDefinition } from '../../src/host/plugin.ts'

/**
 * startHost is the tests' one Host booter: a real Host with real listeners on free ports and a real
 * SQLite file in a temp data dir. The gateway, proxy, benchmark and router supports build their
 * plugins and YAML and boot through it.
 */
export interface TestHost {
  host: Host
  url: string
  dataDir: string
  logs: string[]
  /** stop shuts the host down and removes the data dir. */
  stop(): Promise<void>
  /** stopKeep shuts the host down and keeps the data dir (for restart tests). */
  stopKeep(): Promise<void>
}

export interface HostOptions {
  /** server: settings of the `server:` section beside host 127.0.0.1 and port 0. */
  server?: Record<string, string | number | Record<string, string>>
  /** logLevel: default the config's `log.level`. */
  logLevel?: LogLevel
  /** logSink receives the log lines (default: kept in `logs`). */
  logSink?: LogSink
  /** configFile: write the YAML to this file in the data dir and read it from there, as `serve --config` does. */
  configFile?: string
}

/**
 * SELF is what `@self` in engine and smi commands runs in a test host: the simulators' entry, which
 * takes `sim engine|smi …` like modelgate does without loading the whole app (the gateway spawns one
 * per engine and per GPU probe). The binary's own `@self` is driven by test/e2e.
 */
export const SELF = [process.execPath, resolve(import.meta.dir, '../sim/sim-entry.ts')]

export function tempDataDir(): string {
  return mkdtempSync(join(tmpdir(), 'modelgate-test-'))
}

export async function startHost(
  yaml: string,
  definitions: readonly PluginDefinition[],
  env: Record<string, string | undefined> = {},
  dataDir = tempDataDir(),
  opts: HostOptions = {},
): Promise<TestHost> {
  const server = JSON.stringify({ host: '127.0.0.1', port: 0, ...opts.server })
  const text = `data_dir: ${dataDir}\nserver: ${server}\n${yaml}`
  let config: ReturnType<typeof loadConfig>
  if (opts.configFile) {
    const file = join(dataDir, opts.configFile)
    writeFileSync(file, text)
    config = loadConfigFile(file, env, definitions)
  } else config = loadConfig(text, env, knownPlugins(definitions))
  const logs: string[] = []
  const logger = new Logger(
    opts.logLevel ?? config.root.log.level,
    'test',
    'text',
    opts.logSink ?? ((l) => logs.push(l)),
  )
  const host = new Host({ config, definitions, version: '0.0.0-test', selfCommand: SELF, logger })
  await host.boot()
  return {
    host,
    url: host.urls.main!,
    dataDir,
    logs,
    stopKeep: () => host.shutdown('test'),
    async stop() {
      await host.shutdown('test')
      rmSync(dataDir, { recursive: true, force: true })
    },
  }
}
