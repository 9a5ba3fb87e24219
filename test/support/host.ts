import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { knownPlugins } from '../../src/config/file.ts'
import { loadConfig } from '../../src/config/load.ts'
import { Host } from '../../src/host/host.ts'
import { Logger } from '../../src/host/logger.ts'
import type { PluginDefinition } from '../../src/host/plugin.ts'

/** startHost boots a real Host (real listeners on free ports, real SQLite file in a temp dir). */
export interface TestHost {
  host: Host
  url: string
  dataDir: string
  logs: string[]
  stop(): Promise<void>
}

/** SELF re-runs modelgate from source, as `@self` in engine and smi commands does in the binary. */
export const SELF = [process.execPath, resolve(import.meta.dir, '../../src/main.ts')]

export async function startHost(
  yaml: string,
  definitions: readonly PluginDefinition[],
  env: Record<string, string | undefined> = {},
  dataDir = mkdtempSync(join(tmpdir(), 'modelgate-test-')),
): Promise<TestHost> {
  const full = `data_dir: ${dataDir}\nserver: { host: 127.0.0.1, port: 0 }\n${yaml}`
  const config = loadConfig(full, env, knownPlugins(definitions))
  const logs: string[] = []
  const logger = new Logger(config.root.log.level, 'test', 'text', (l) => logs.push(l))
  const host = new Host({
    config,
    definitions,
    version: '0.0.0-test',
    selfCommand: SELF,
    logger,
  })
  await host.boot()
  return {
    host,
    url: host.urls.main!,
    dataDir,
    logs,
    async stop() {
      await host.shutdown('test')
      rmSync(dataDir, { recursive: true, force: true })
    },
  }
}
