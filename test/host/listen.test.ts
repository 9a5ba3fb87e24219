import { afterAll, describe, expect, it, setDefaultTimeout } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'

/**
 * A listener whose port another process holds: `serve` names the listener, address and port and
 * says it is in use, and exits 1, not 2: the port may be free on the next try, so systemd's
 * Restart= may retry (exit 2, a configuration error, it does not).
 */
const ROOT = resolve(import.meta.dir, '../..')
const dir = mkdtempSync(join(tmpdir(), 'modelgate-listen-'))
/** The port this test holds open, as another process would. */
const held = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
afterAll(() => {
  held.stop(true)
  rmSync(dir, { recursive: true, force: true })
})
// Each case spawns modelgate: a slow shared machine needs more than bun's 5 s.
setDefaultTimeout(60_000)

function serve(yaml: string) {
  const file = join(dir, 'modelgate.yaml')
  writeFileSync(file, `data_dir: ${join(dir, 'data')}\n${yaml}`)
  const r = Bun.spawnSync([process.execPath, join(ROOT, 'src/main.ts'), 'serve', '--config', file], {
    cwd: dir,
    env: { PATH: process.env.PATH ?? '' },
    timeout: 30_000,
  })
  return { code: r.exitCode, err: r.stderr.toString() }
}

describe('a port already in use', () => {
  it('the main listener: names it, its address and port, and exits 1', () => {
    const r = serve(`server: { host: 127.0.0.1, port: ${held.port} }\n`)
    expect(r.code).toBe(1)
    expect(r.err).toContain(`main listener: 127.0.0.1:${held.port} is already in use`)
  })

  it("a plugin's listener (the router's) the same way", () => {
    const r = serve(`server: { host: 127.0.0.1, port: 0 }
plugins:
  router: { host: 127.0.0.1, port: ${held.port} }
`)
    expect(r.code).toBe(1)
    expect(r.err).toContain(`router listener: 127.0.0.1:${held.port} is already in use`)
    // The main listener, open by then, is closed again by the failed boot's shutdown.
    expect(r.err).toContain('stopped')
  })
})
