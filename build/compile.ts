/**
 * compile.ts builds the single executable `build/dist/modelgate`. Everything it needs at run time is
 * inside: plugins (static imports), SQL migrations and the demo config (text imports), the Swagger
 * UI assets (file imports) and the version (package.json). It ignores bunfig.toml and .env files on
 * the host so a stray file cannot change its behaviour.
 */
import { mkdirSync } from 'node:fs'
import { join } from 'node:path'

const root = join(import.meta.dir, '..')
const outfile = join(root, 'build', 'dist', 'modelgate')
mkdirSync(join(root, 'build', 'dist'), { recursive: true })

const started = performance.now()
const result = await Bun.build({
  entrypoints: [join(root, 'src', 'main.ts')],
  minify: { syntax: true, whitespace: true, identifiers: false },
  sourcemap: 'none',
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
