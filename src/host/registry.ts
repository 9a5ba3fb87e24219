import type { PluginDefinition } from './plugin.ts'

/**
 * orderPlugins sorts enabled plugins so each comes after the plugins it depends on (stable:
 * otherwise the order of the static plugin list). A cycle or a missing dependency is an error
 * naming the plugin.
 */
export function orderPlugins(
  defs: readonly PluginDefinition[],
  enabled: ReadonlySet<string>,
): PluginDefinition[] {
  const byId = new Map(defs.map((d) => [d.id, d]))
  const out: PluginDefinition[] = []
  const state = new Map<string, 'visiting' | 'done'>()
  const visit = (id: string, chain: string[]) => {
    const s = state.get(id)
    if (s === 'done') return
    if (s === 'visiting') throw new Error(`plugins.${id}: dependency cycle (${[...chain, id].join(' -> ')})`)
    const def = byId.get(id)
    if (!def) throw new Error(`plugins.${chain[chain.length - 1] ?? id}: unknown plugin '${id}'`)
    state.set(id, 'visiting')
    for (const dep of def.dependsOn ?? []) {
      if (!enabled.has(dep)) throw new Error(`plugins.${id}: requires plugin '${dep}', which is not enabled`)
      visit(dep, [...chain, id])
    }
    state.set(id, 'done')
    out.push(def)
  }
  for (const d of defs) if (enabled.has(d.id)) visit(d.id, [])
  return out
}
