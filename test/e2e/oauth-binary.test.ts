import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import type { Subprocess } from 'bun'
import { freePort } from '../sim/helpers.ts'
import {
  Browser,
  claimsOf,
  fragmentOf,
  type Platform,
  type Provider,
  startPlatform,
  startProvider,
} from '../support/oauth.ts'
import { waitFor } from '../support/wait.ts'

/**
 * OAuth mode in the compiled binary: the OAuth client library (oauth4webapi) is inside it, and a
 * whole login runs against a real OAuth 2 provider and the platform stand-in of the test process.
 */
const ROOT = resolve(import.meta.dir, '../..')
const dir = mkdtempSync(join(tmpdir(), 'modelgate-oauth-bin-'))
const BIN = join(dir, 'modelgate')
/** The listener: a free port, so a second copy of the suite beside this one never meets it. */
const PORT = await freePort()
const URL = `http://127.0.0.1:${PORT}`
let provider: Provider
let platform: Platform
let child: Subprocess | null = null

beforeAll(async () => {
  const build = Bun.spawnSync([process.execPath, join(ROOT, 'build/compile.ts')], { cwd: ROOT })
  if (build.exitCode !== 0) throw new Error(`build failed: ${build.stderr.toString()}`)
  copyFileSync(join(ROOT, 'build/dist/modelgate'), BIN)
  writeFileSync(
    join(dir, 'modelgate.yaml'),
    `server: { host: 127.0.0.1, port: ${PORT} }\ndata_dir: ./data\nshutdown: { timeout_ms: 5000 }\nplugins: {}\n`,
  )
  provider = await startProvider('rfc8414')
  platform = await startPlatform({ alice: { uid: 'uid-alice', groups: ['service-admins'] } })
})

afterAll(async () => {
  child?.kill('SIGKILL')
  await platform?.stop()
  await provider?.stop()
  rmSync(dir, { recursive: true, force: true })
})

describe('the compiled binary in OAuth mode', () => {
  it('answers /api/auth/info and logs a platform admin in end to end', async () => {
    child = Bun.spawn([BIN, 'serve', '--config', 'modelgate.yaml'], {
      cwd: dir,
      env: {
        PATH: process.env.PATH ?? '',
        AUTH_MODE: 'oauth',
        JWT_SECRET: 'b'.repeat(40),
        OAUTH_ISSUER_URL: provider.issuer,
        OAUTH_CLIENT_ID: 'modelgate',
        OAUTH_CLIENT_SECRET: 'client-secret',
        K8S_API_URL: platform.url,
        API_BASE_URL: URL,
      },
      stdin: 'ignore',
      stdout: 'pipe',
      stderr: 'pipe',
    })
    const running = child
    await waitFor(
      'the binary to be ready',
      () => {
        if (running.exitCode !== null)
          throw new Error(`the binary exited ${running.exitCode} before it was ready`)
        return fetch(`${URL}/api/health/ready`).then(
          (r) => r.ok,
          () => false,
        )
      },
      { timeoutMs: 15_000, pollMs: 25 },
    )
    expect(await (await fetch(`${URL}/api/auth/info`)).json()).toMatchObject({
      mode: 'oauth',
      login_url: '/api/auth/login',
      login_method: 'GET',
      oauth: { issuer_url: provider.issuer, callback_url: `${URL}/api/auth/callback` },
    })

    provider.user = 'alice'
    const b = new Browser()
    const start = await b.get(`${URL}/api/auth/login`)
    expect(start.status).toBe(302)
    const atProvider = await b.get(start.headers.get('location')!)
    expect(atProvider.status).toBe(302)
    const done = await b.get(atProvider.headers.get('location')!)
    expect(done.status).toBe(302)
    const token = fragmentOf(done.headers.get('location')!).get('token')!
    expect(claimsOf(token)).toMatchObject({ username: 'alice', roles: ['admin'], authMode: 'oauth' })
    const me = await fetch(`${URL}/api/auth/me`, { headers: { authorization: `Bearer ${token}` } })
    expect(await me.json()).toMatchObject({ sub: 'uid-alice', username: 'alice', authMode: 'oauth' })

    running.kill('SIGTERM')
    expect(await running.exited).toBe(0)
    child = null
  })
})
