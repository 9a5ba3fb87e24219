import { describe, expect, it } from 'bun:test'
import { Glob } from 'bun'

/**
 * The layering src/README.md's architecture section draws, checked on the import statements:
 * - the core (host, config, http, wire, store, dashboard) names no plugin and none of the engine/GPU library;
 * - src/ imports from plugins/ only in the composition root (src/main.ts);
 * - the engine/GPU library (src/engine, src/gpu) is shared by plugins/gateway and the simulator,
 *   and imports neither of them;
 * - a plugin reaches another plugin only through that plugin's `api.ts` (its dashboard pages too).
 */
const root = `${import.meta.dir}/../..`
/** Static imports and re-exports (`from '…'`, bare `import '…'`) and `import('…')` in code or types. */
const IMPORT = /^\s*(?:import|export)\s*(?:[^'"]*?from\s*)?'([^']+)'|import\(\s*'([^']+)'\s*\)/gm

async function importsOf(dir: string): Promise<{ file: string; target: string }[]> {
  const out: { file: string; target: string }[] = []
  for await (const file of new Glob(`${dir}/**/*.{ts,tsx}`).scan(root)) {
    const text = await Bun.file(`${root}/${file}`).text()
    for (const m of text.matchAll(IMPORT)) {
      const spec = (m[1] ?? m[2])!
      if (!spec.startsWith('.')) continue
      const target = new URL(spec, `file:///${file}`).pathname.slice(1)
      out.push({ file, target })
    }
  }
  return out
}

/** findCycles: one cycle per strongly connected group of files, as `a → b → a`. */
function findCycles(graph: Map<string, string[]>): string[] {
  const state = new Map<string, 'open' | 'done'>()
  const stack: string[] = []
  const cycles: string[] = []
  const seen = new Set<string>()
  const visit = (file: string) => {
    state.set(file, 'open')
    stack.push(file)
    for (const next of graph.get(file) ?? []) {
      const s = state.get(next)
      if (s === 'open') {
        const cycle = [...stack.slice(stack.indexOf(next)), next]
        const key = [...cycle.slice(0, -1)].sort().join(',')
        if (!seen.has(key)) {
          seen.add(key)
          cycles.push(cycle.join(' → '))
        }
      } else if (s === undefined && graph.has(next)) visit(next)
    }
    stack.pop()
    state.set(file, 'done')
  }
  for (const file of graph.keys()) if (!state.has(file)) visit(file)
  return cycles
}

function offenders(edges: { file: string; target: string }[], banned: string[]): string[] {
  return edges.filter((e) => banned.some((b) => e.target.startsWith(b))).map((e) => `${e.file} → ${e.target}`)
}

describe('layering', () => {
  it('the core imports no plugin and none of the engine/GPU library or the simulator', async () => {
    const edges: { file: string; target: string }[] = []
    for (const core of ['src/host', 'src/config', 'src/http', 'src/wire', 'src/store', 'src/dashboard']) {
      edges.push(...(await importsOf(core)))
    }
    // The scan saw the core's imports (the test would pass on an empty scan otherwise).
    expect(edges.some((e) => e.file === 'src/host/host.ts' && e.target === 'src/wire/server.ts')).toBe(true)
    expect(offenders(edges, ['plugins/', 'src/engine/', 'src/gpu/', 'src/sim/'])).toEqual([])
  })

  it('src/ imports plugins/ only from the composition root', async () => {
    const edges = await importsOf('src')
    const fromPlugins = offenders(edges, ['plugins/']).map((e) => e.split(' → ')[0])
    expect(fromPlugins).toEqual(['src/main.ts'])
  })

  it('no import cycle in src/ or plugins/ (type-only imports included)', async () => {
    const graph = new Map<string, string[]>()
    for (const e of [...(await importsOf('src')), ...(await importsOf('plugins'))]) {
      const list = graph.get(e.file) ?? []
      list.push(e.target)
      graph.set(e.file, list)
    }
    expect(graph.size).toBeGreaterThan(50)
    const cycles = findCycles(graph)
    expect(cycles).toEqual([])
  })

  it('a plugin folder imports another plugin folder only through its api.ts', async () => {
    const edges = await importsOf('plugins')
    const folder = (path: string) => /^plugins\/([^/]+)\//.exec(path)?.[1]
    const across = edges.filter((e) => {
      const from = folder(e.file)
      const to = folder(e.target)
      return from !== undefined && to !== undefined && from !== to
    })
    // The scan saw the plugins' own api.ts imports (the test would pass on an empty scan otherwise).
    expect(across.some((e) => e.target === 'plugins/gateway/api.ts')).toBe(true)
    expect(edges.some((e) => e.file.endsWith('.tsx'))).toBe(true)
    const offenders = across.filter((e) => e.target !== `plugins/${folder(e.target)}/api.ts`)
    expect(offenders.map((e) => `${e.file} → ${e.target}`)).toEqual([])
  })

  it('the engine/GPU library imports neither the gateway nor the simulator', async () => {
    for (const lib of ['src/engine', 'src/gpu']) {
      expect(offenders(await importsOf(lib), ['plugins/', 'src/sim/'])).toEqual([])
    }
  })
})
