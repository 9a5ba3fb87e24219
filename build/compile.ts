/**
 * compile.ts builds the single executable `build/dist/modelgate`. Everything it needs at run time is
 * inside: plugins (static imports), SQL migrations and the demo config (text imports), the Swagger
 * UI assets and the dashboard's bundle (file imports) and the version (package.json). It ignores
 * bunfig.toml and .env files on the host so a stray file cannot change its behaviour.
 */
import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { type DashboardFile, writeDashboard } from './dashboard.ts'

const root = join(import.meta.dir, '..')
const outfile = join(root, 'build', 'dist', 'modelgate')
mkdirSync(join(root, 'build', 'dist'), { recursive: true })

/**
 * embeddedDashboard is the module that stands in for src/dashboard/bundle.ts in the
 * binary: the same `loadBundle()`, reading the files built into `dir` and embedded by file imports.
 */
function embeddedDashboard(dir: string, files: DashboardFile[]): string {
  const imports = files.map(
    (f, i) => `import f${i} from ${JSON.stringify(join(dir, f.name))} with { type: 'file' }`,
  )
  const list = files.map(
    (f, i) => `{ name: ${JSON.stringify(f.name)}, type: ${JSON.stringify(f.type)}, path: f${i} }`,
  )
  return `${imports.join('\n')}
const FILES = [${list.join(', ')}]
export async function loadBundle() {
  return Promise.all(FILES.map(async (f) => ({ name: f.name, type: f.type, bytes: await Bun.file(f.path).bytes() })))
}
`
}

const started = performance.now()
const dashboardDir = join(root, 'build', 'dist', 'dashboard')
const dashboard = embeddedDashboard(dashboardDir, await writeDashboard(dashboardDir))
const result = await Bun.build({
  entrypoints: [join(root, 'src', 'main.ts')],
  minify: { syntax: true, whitespace: true, identifiers: false },
  sourcemap: 'none',
  plugins: [
    {
      name: 'embed-dashboard',
      setup(build) {
        build.onLoad({ filter: /src[\\/]dashboard[\\/]bundle\.ts$/ }, () => ({
          contents: dashboard,
          loader: 'ts',
        }))
      },
    },
  ],
  compile: {
    outfile,
    autoloadBunfig: false,
    autoloadDotenv: false,
  },
})
if (!result.success) {
  for (const log of result.logs) console.error(log)
  process.exit(1)
}
console.log(`built ${outfile} in ${Math.round(performance.now() - started)} ms`)
