import { existsSync, readFileSync } from 'node:fs'
import { resolve } from 'node:path'
import type { PluginDefinition } from '../host/plugin.ts'
import { ConfigError, type Env, type LoadedConfig, loadConfig, type PluginSchemaInfo } from './load.ts'

/** knownPlugins turns the static plugin list into what the config validator needs (schema, dependencies, validate). */
export function knownPlugins(defs: readonly PluginDefinition[]): Map<string, PluginSchemaInfo> {
  return new Map(
    defs.map((d) => [
      d.id,
      {
        schema: d.config,
        dependsOn: d.dependsOn ?? [],
        ...(d.validate ? { validate: d.validate.bind(d) } : {}),
      },
    ]),
  )
}

/** loadConfigFile reads a YAML file (clear error when missing) and validates it. */
export function loadConfigFile(path: string, env: Env, defs: readonly PluginDefinition[]): LoadedConfig {
  if (!existsSync(path)) throw new ConfigError([`(file): config file not found: ${path}`])
  return { ...loadConfig(readFileSync(path, 'utf8'), env, knownPlugins(defs)), file: resolve(path) }
}
