import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import type { Subprocess } from 'bun'
import pkg from '../../package.json' with { type: 'json' }

import { freePort, groupAlive } from '../sim/helpers.ts'
import { OtlpReceiver } from '../support/otlp-receiver.ts'
import { parse, rawExchange } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'

/**
 * End to end on the compiled binary: built once, copied alone into an empty directory with only a
 * YAML beside it, then driven over HTTP and signals like an operator would.
 */
const ROOT = resolve(import.meta.dir, '../..')
const dir = mkdtempSync(join(tmpdir(), 'modelgate-bin-'))
const BIN = join(dir, 'modelgate')
/** The listener: a free port, so a second copy of the suite beside this one never meets it. */
const PORT = await freePort()
const URL = `http://127.0.0.1:${PORT}`
const SECRET = 'e2e-secret-that-is-long-enough-0123456789'
const children: Subprocess[] = []
/** The binary exports its traces here: the OpenTelemetry SDK must work inside the compiled binary. */
const receiver = new OtlpReceiver()

function run(args: string[], env: Record<string, string> = {}) {
  const r = Bun.spawnSync([BIN, ...args], { cwd: dir, env: { PATH: process.env.PATH ?? '', ...env } })
  return { code: r.exitCode, stdout: r.stdout.toString(), stderr: r.stderr.toString() }
}

beforeAll(() => {
  const build = Bun.spawnSync([process.execPath, join(ROOT, 'build/compile.ts')], { cwd: ROOT })
  if (build.exitCode !== 0) throw new Error(`build failed: ${build.stderr.toString()}`)
  copyFileSync(join(ROOT, 'build/dist/modelgate'), BIN)
  writeFileSync(
    join(dir, 'modelgate.yaml'),
    `server: { host: 127.0.0.1, port: ${PORT} }
data_dir: ./data
shutdown: { timeout_ms: 10000 }
telemetry: { otlp_endpoint: '${receiver.url}', service_name: modelgate-e2e }
plugins:
  gateway:
    engine:
      command: ['@self', sim, engine, --sim-dir, ./sim, --sim-gpus, 2x80]
      env: { SIM_LOAD_DELAY_MS: '200', SIM_TOKENS_PER_SEC: '100' }
      port_range: { start: 18391, end: 18399 }
      stop_grace_seconds: 3
    gpu:
      smi_command: ['@self', sim, smi, --sim-dir, ./sim, --sim-gpus, 2x80]
`,
  )
  writeFileSync(
    join(dir, 'stubborn.yaml'),
    `server: { host: 127.0.0.1, port: ${PORT} }
data_dir: ./data-stubborn
shutdown: { timeout_ms: 60000 }
plugins:
  gateway:
    engine:
      command: ['@self', sim, engine, --sim-dir, ./sim-stubborn, --sim-gpus, 2x80]
      env: { SIM_LOAD_DELAY_MS: '200', SIM_HANG_ON_TERM: '1' }
      port_range: { start: 18391, end: 18399 }
      stop_grace_seconds: 60
    gpu:
      smi_command: ['@self', sim, smi, --sim-dir, ./sim-stubborn, --sim-gpus, 2x80]
`,
  )
  writeFileSync(join(dir, 'bad.yaml'), 'server: { port: 70000, prot: 1 }\nplugins: { nope: {} }\n')
})

afterAll(() => {
  receiver.stop()
  for (const c of children) c.kill('SIGKILL')
  rmSync(dir, { recursive: true, force: true })
})

/** waitReady waits until /api/health/ready answers 200 (throws if the binary exits first). */
async function waitReady(child: Subprocess): Promise<void> {
  await waitFor(
    'the binary to be ready',
    () => {
      if (child.exitCode !== null) throw new Error(`the binary exited ${child.exitCode} before it was ready`)
      return fetch(`${URL}/api/health/ready`).then(
        (r) => r.ok,
        () => false,
      )
    },
    { timeoutMs: 15_000, pollMs: 25 },
  )
}

/** waitActive waits until the instance is active and returns it. */
async function waitActive(id: string, headers: Record<string, string> = {}) {
  type Model = { status: string; process_id: number }
  let last: Model | undefined
  return waitFor(
    `instance ${id} to be active`,
    async () => {
      last = ((await (await fetch(`${URL}/api/v1/models/${id}`, { headers })).json()) as { model: Model })
        .model
      return last?.status === 'active' ? last : undefined
    },
    { timeoutMs: 15_000, pollMs: 25, show: () => last },
  )
}

describe('the compiled binary', () => {
  it('prints its version', () => {
    const r = run(['version'])
    expect(r.code).toBe(0)
    expect(r.stdout.trim()).toBe(pkg.version)
  })

  it('checks a config: exit 0, or exit 2 listing every problem by dotted path', () => {
    expect(run(['check-config', '--config', 'modelgate.yaml']).code).toBe(0)
    const bad = run(['check-config', '--config', 'bad.yaml'])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('server.port: must be an integer <= 65535')
    expect(bad.stderr).toContain('server.prot: unknown key')
    expect(bad.stderr).toContain('plugins.nope: unknown plugin')
  })

  it('refuses to start in simple mode with a short JWT secret or no admin password', () => {
    const r = run(['serve', '--config', 'modelgate.yaml'], { AUTH_MODE: 'simple', JWT_SECRET: 'short' })
    expect(r.code).toBe(2)
    expect(r.stderr).toContain('auth.jwt_secret: JWT_SECRET must be at least 32 bytes')
    expect(r.stderr).toContain('auth.admin_password: ADMIN_PASSWORD is required')
  })

  it('serves health, offline docs, login, metrics and an engine, and exits 0 on SIGTERM with nothing left', async () => {
    const child = Bun.spawn([BIN, 'serve', '--config', 'modelgate.yaml'], {
      cwd: dir,
      env: {
        PATH: process.env.PATH ?? '',
        AUTH_MODE: 'simple',
        ADMIN_PASSWORD: 'pw-e2e',
        JWT_SECRET: SECRET,
      },
      stdin: 'ignore',
      stdout: 'pipe',
      stderr: 'pipe',
    })
    children.push(child)
    await waitReady(child)
    const health = await fetch(`${URL}/api/health`)
    expect(health.status).toBe(200)
    expect(await health.json()).toMatchObject({ status: 'ok', version: pkg.version })
    expect(await (await fetch(`${URL}/api/health/live`)).json()).toMatchObject({ status: 'alive' })

    const docs = await fetch(`${URL}/docs`)
    expect(docs.headers.get('content-security-policy')).toContain("frame-ancestors 'none'")
    expect(docs.headers.get('x-frame-options')).toBe('DENY')
    const page = await docs.text()
    expect(page).toContain('/docs/assets/swagger-ui-bundle.js')
    expect(page).not.toMatch(/https?:\/\//)
    const bundle = await fetch(`${URL}/docs/assets/swagger-ui-bundle.js`)
    expect(bundle.status).toBe(200)
    expect((await bundle.arrayBuffer()).byteLength).toBeGreaterThan(500_000)
    expect((await fetch(`${URL}/docs/assets/swagger-ui.css`)).status).toBe(200)
    const init = await fetch(`${URL}/docs/assets/init.js`)
    expect(init.status).toBe(200)
    expect(await init.text()).toContain('persistAuthorization: false')
    // The dashboard is inside the binary too: its page and the assets it names, nothing from elsewhere.
    const dashboard = await (await fetch(`${URL}/`)).text()
    expect(dashboard).not.toMatch(/https?:\/\//)
    const assets = [...dashboard.matchAll(/(?:src|href)="(\/assets\/[^"]+)"/g)].map((m) => m[1]!)
    expect(assets).toHaveLength(2)
    for (const a of assets) expect((await fetch(`${URL}${a}`)).status).toBe(200)
    const doc = (await (await fetch(`${URL}/docs/json`)).json()) as {
      paths: Record<string, unknown>
      components: { securitySchemes: Record<string, unknown> }
    }
    expect(Object.keys(doc.components.securitySchemes).sort()).toEqual(['adminJwt', 'inferenceKey'])
    expect(doc.paths['/api/v1/models/load']).toBeDefined()

    expect((await fetch(`${URL}/api/v1/models`)).status).toBe(401)
    const login = await fetch(`${URL}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'admin', password: 'pw-e2e' }),
    })
    expect(login.status).toBe(200)
    const { token } = (await login.json()) as { token: string }
    const auth = { authorization: `Bearer ${token}`, 'content-type': 'application/json' }
    const load = await fetch(`${URL}/api/v1/models/load`, {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({ model_path: 'facebook/opt-125m', gpu_memory_utilization: 0.3 }),
    })
    expect(load.status).toBe(202)
    const { instance_id } = (await load.json()) as { instance_id: string }
    const model = await waitActive(instance_id, auth)
    expect(model?.status).toBe('active')

    const metrics = await (await fetch(`${URL}/metrics`)).text()
    expect(metrics).toContain('modelgate_process_resident_memory_bytes')
    expect(metrics).toContain('modelgate_models_total{status="active"} 1')
    expect((await fetch(`${URL}/api/v1/metrics`)).status).toBe(401)
    expect((await fetch(`${URL}/api/v1/metrics`, { headers: auth })).status).toBe(200)

    // The bypass of issue 16: a three-character Host and a prefixed path reached the admin API.
    const load2 = JSON.stringify({ model_path: 'facebook/opt-125m', extra_args: ['--trust-remote-code'] })
    for (const target of ['/xx/api/v1/models/load', '/api/v1/models/load']) {
      const r = await rawExchange(
        PORT,
        `POST ${target} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: ${load2.length}\r\n\r\n${load2}`,
        { waitMs: 5000, until: (t) => parse(t).length === 1 },
      )
      expect(parse(r.text)[0]!.status).toBe(target.startsWith('/xx') ? 404 : 401)
    }
    const listed = (await (await fetch(`${URL}/api/v1/models`, { headers: auth })).json()) as {
      models: unknown[]
    }
    expect(listed.models).toHaveLength(1)

    // SIGTERM with a stream running: it ends whole (40 tokens at 100/s), then the engine stops.
    const chat = await fetch(`${URL}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'facebook/opt-125m',
        messages: [{ role: 'user', content: 'count' }],
        max_tokens: 40,
        ignore_eos: true,
        stream: true,
      }),
    })
    const reader = chat.body!.getReader()
    let streamed = new TextDecoder().decode((await reader.read()).value)
    child.kill('SIGTERM')
    for (;;) {
      const { value, done } = await reader.read()
      if (done) break
      streamed += new TextDecoder().decode(value)
    }
    expect(streamed.trimEnd().endsWith('data: [DONE]')).toBe(true)
    expect(streamed).not.toContain('"error"')
    expect(await child.exited).toBe(0)
    let gone = false
    try {
      process.kill(-model!.process_id, 0)
    } catch {
      gone = true
    }
    expect(gone).toBe(true)
    const logs = await new Response(child.stderr).text()
    expect(logs).toContain('shutting down')
    // The SDK ran inside the binary and was flushed at exit: the load's trace, with its phases.
    const loadSpan = receiver.spans.find((s) => s.name === 'gateway.load')
    expect(loadSpan?.resource['service.name']).toBe('modelgate-e2e')
    expect(receiver.spans.filter((s) => s.parentSpanId === loadSpan?.spanId).map((s) => s.name)).toContain(
      'load.ready',
    )
    expect(logs).not.toContain(token)
  })

  it('exits at once on a second signal, killing an engine that ignores SIGTERM', async () => {
    const child = Bun.spawn([BIN, 'serve', '--config', 'stubborn.yaml'], {
      cwd: dir,
      env: { PATH: process.env.PATH ?? '' },
      stdin: 'ignore',
      stdout: 'ignore',
      stderr: 'pipe',
    })
    children.push(child)
    let logs = ''
    const logged = new Set<() => void>()
    void (async () => {
      const decoder = new TextDecoder()
      for await (const chunk of child.stderr) {
        logs += decoder.decode(chunk, { stream: true })
        for (const f of logged) f()
      }
    })()
    await waitReady(child)
    const load = await fetch(`${URL}/api/v1/models/load`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model_path: 'facebook/opt-125m', gpu_memory_utilization: 0.3 }),
    })
    const { instance_id } = (await load.json()) as { instance_id: string }
    const pid = (await waitActive(instance_id)).process_id
    child.kill('SIGTERM')
    await waitFor('the binary to log that it is shutting down', () => logs.includes('shutting down'), {
      wake: (notify) => {
        logged.add(notify)
        return () => logged.delete(notify)
      },
    })
    // An absence, so it is watched for a while: the shutdown waits out the engine's 60 s grace.
    await Bun.sleep(500)
    expect(child.exitCode).toBeNull() // still waiting for the stubborn engine's grace period
    const exit: { code?: number } = {}
    void child.exited.then((c) => {
      exit.code = c
    })
    child.kill('SIGINT')
    // A deadline well inside the engine's 60 s grace: the second signal does not wait it out.
    await waitFor('the binary to exit on SIGINT', () => exit.code !== undefined, { timeoutMs: 20_000 })
    expect(exit.code).toBe(130)
    const gone = await waitFor(`engine group ${pid} to be gone`, () => !groupAlive(pid), { timeoutMs: 2500 })
    expect(gone).toBe(true)
  })
})
