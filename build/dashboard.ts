/**
 * dashboard.ts bundles the web dashboard with Bun.build: the host's shell (src/dashboard/client/)
 * and each plugin's client module (its definition's `dashboard.client`), which the shell imports as
 * `modelgate:dashboard-clients`, a module made here from that list. index.html names the entry
 * script and stylesheet, which come out minified under hashed names served from `/assets/`.
 * Nothing is fetched from elsewhere: Preact and its signals are bundled in.
 *
 * Three callers: the host running from source bundles on the first request for the page
 * (src/dashboard/bundle.ts), compile.ts writes the files to build/dist/dashboard/ and embeds them in
 * the binary, and `bun build/dashboard.ts` writes them and prints their sizes. Every compiled-in
 * plugin's pages are in the bundle; the page shows those of the plugins that are on.
 */
import { mkdirSync, rmSync } from 'node:fs'
import { basename, join } from 'node:path'

/** DashboardFile: one file of the bundle, by the name it is served under (`index.html`, `index-<hash>.js`). */
export interface DashboardFile {
  name: string
  type: string
  bytes: Uint8Array<ArrayBuffer>
}

const root = join(import.meta.dir, '..')
export const DASHBOARD_ENTRY = join(root, 'src', 'dashboard', 'client', 'index.html')
/** CLIENTS_MODULE: the name the shell imports the plugins' client modules by. */
const CLIENTS_MODULE = 'modelgate:dashboard-clients'
/** ASSET_PREFIX: where the page loads its hashed assets from (the dashboard routes serve it). */
export const ASSET_PREFIX = '/assets/'

/** pluginClients: the client modules of every plugin in the static plugin list, in its order. */
export async function pluginClients(): Promise<string[]> {
  const { plugins } = await import('../plugins/index.ts')
  return plugins.flatMap((p) => (p.dashboard ? [p.dashboard.client] : []))
}

/** clientsModule: the source of `modelgate:dashboard-clients`, each module's default export in order. */
function clientsModule(clients: readonly string[]): string {
  const imports = clients.map((c, i) => `import c${i} from ${JSON.stringify(c)}`)
  return `${imports.join('\n')}\nexport default [${clients.map((_, i) => `c${i}`).join(', ')}]\n`
}

export async function buildDashboard(clients?: readonly string[]): Promise<DashboardFile[]> {
  const contents = clientsModule(clients ?? (await pluginClients()))
  const result = await Bun.build({
    entrypoints: [DASHBOARD_ENTRY],
    plugins: [
      {
        name: 'dashboard-clients',
        setup(build) {
          build.onResolve({ filter: /^modelgate:dashboard-clients$/ }, () => ({
            path: CLIENTS_MODULE,
            namespace: 'dashboard-clients',
          }))
          build.onLoad({ filter: /.*/, namespace: 'dashboard-clients' }, () => ({ contents, loader: 'ts' }))
        },
      },
    ],
    target: 'browser',
    minify: true,
    sourcemap: 'none',
    publicPath: ASSET_PREFIX,
    naming: { entry: '[name].[ext]', chunk: '[name]-[hash].[ext]', asset: '[name]-[hash].[ext]' },
    jsx: { runtime: 'automatic', importSource: 'preact', development: false },
    define: { 'process.env.NODE_ENV': '"production"' },
  })
  if (!result.success) {
    const logs = result.logs.map((l) => String(l)).join('\n')
    throw new Error(`the dashboard bundle failed to build:\n${logs}`)
  }
  return Promise.all(
    result.outputs.map(async (o) => ({
      name: basename(o.path),
      type: o.type,
      bytes: new Uint8Array(await o.arrayBuffer()),
    })),
  )
}

/** writeDashboard builds into `dir` (emptied first) and returns the files written. */
export async function writeDashboard(dir: string): Promise<DashboardFile[]> {
  const files = await buildDashboard()
  rmSync(dir, { recursive: true, force: true })
  mkdirSync(dir, { recursive: true })
  for (const f of files) await Bun.write(join(dir, f.name), f.bytes)
  return files
}

if (import.meta.main) {
  const dir = join(root, 'build', 'dist', 'dashboard')
  const started = performance.now()
  const files = await writeDashboard(dir)
  let raw = 0
  let gz = 0
  for (const f of files) {
    const zipped = Bun.gzipSync(f.bytes).length
    raw += f.bytes.length
    gz += zipped
    console.log(
      `${f.name.padEnd(28)} ${String(f.bytes.length).padStart(8)} B  ${String(zipped).padStart(7)} B gzipped`,
    )
  }
  console.log(`${'total'.padEnd(28)} ${String(raw).padStart(8)} B  ${String(gz).padStart(7)} B gzipped`)
  console.log(`wrote ${dir} in ${Math.round(performance.now() - started)} ms`)
}
