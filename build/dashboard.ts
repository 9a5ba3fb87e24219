/**
 * dashboard.ts bundles the web dashboard (plugins/gateway/dashboard/client/) with Bun.build: its
 * index.html names the entry script and stylesheet, which come out minified under hashed names
 * served from `/assets/`. Nothing is fetched from elsewhere: Preact and its signals are bundled in.
 *
 * Three callers: the gateway running from source bundles on the first request for the page
 * (plugins/gateway/dashboard/bundle.ts), compile.ts writes the files to build/dist/dashboard/ and
 * embeds them in the binary, and `bun build/dashboard.ts` writes them and prints their sizes.
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
export const DASHBOARD_ENTRY = join(root, 'plugins', 'gateway', 'dashboard', 'client', 'index.html')
/** ASSET_PREFIX: where the page loads its hashed assets from (the dashboard routes serve it). */
export const ASSET_PREFIX = '/assets/'

export async function buildDashboard(): Promise<DashboardFile[]> {
  const result = await Bun.build({
    entrypoints: [DASHBOARD_ENTRY],
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
