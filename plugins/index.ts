import type { PluginDefinition } from '../src/host/plugin.ts'
import benchmarks from './benchmarks/index.ts'
import cluster from './cluster/index.ts'
import gateway from './gateway/index.ts'
import router from './router/index.ts'

/**
 * plugins is the static list of every plugin compiled into the binary (a compiled binary only
 * contains what is imported, so plugins are never discovered from disk). Order here is the
 * tie-break after dependency order.
 */
export const plugins: readonly PluginDefinition[] = [gateway, benchmarks, router, cluster]
