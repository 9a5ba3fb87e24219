import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { HF_TOKEN_MASK } from '../../plugins/gateway/settings/schemas.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { readSse } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The model-hub token setting through real sockets with auth on (simple mode), real simulator engines
 * and a real data dir: admin reads it, admin-readonly reads a fixed mask, new engines get it as HF_TOKEN
 * in their environment (read from /proc, the engine process's own), never on their command line, in
 * the logs, /metrics or event streams; it survives a restart in a file only the service's user reads.
 */
const TOKEN = 'hf_SettingsTestToken0123456789abcdefXYZ'
const TOKEN2 = 'hf_SecondTokenAfterTheChange9876543210'
const PASSWORD = 'settings-test-password'
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: PASSWORD, JWT_SECRET: 'j'.repeat(40) }
const PORTS: [number, number] = [18710, 18719]

/** engineEnv: the environment the engine process `pid` was started with. */
function engineEnv(pid: number): Record<string, string> {
  const out: Record<string, string> = {}
  for (const entry of readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')) {
    const eq = entry.indexOf('=')
    if (eq > 0) out[entry.slice(0, eq)] = entry.slice(eq + 1)
  }
  return out
}

/** engineLogs: every engine log file of the data dir, concatenated. */
function engineLogs(dataDir: string): string {
  const root = join(dataDir, 'engines')
  let text = ''
  for (const id of readdirSync(root))
    for (const f of readdirSync(join(root, id))) text += readFileSync(join(root, id, f), 'utf8')
  return text
}

describe('settings: the model-hub token', () => {
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-settings-'))
  const dataDir = join(dir, 'data')
  const simDir = join(dir, 'sim')
  let gw: TestGateway
  let admin: string
  let readonly: string
  const logs: string[] = []

  const boot = async () => {
    gw = await startGateway({ ports: PORTS, dataDir, simDir, hostEnv: AUTH })
    const login = await gw.json<{ token: string }>('/api/auth/login', {
      method: 'POST',
      body: JSON.stringify({ username: 'admin', password: PASSWORD }),
    })
    expect(login.status).toBe(200)
    admin = login.body.token
    readonly = (await gw.host.auth.issueToken('viewer', ['admin-readonly'])).token
  }
  const as = (token: string, init: RequestInit = {}) => ({
    ...init,
    headers: { authorization: `Bearer ${token}`, ...(init.headers ?? {}) },
  })
  type Settings = { hf_token: string | null; hf_token_set: boolean; hf_token_masked: boolean }
  const put = (token: string, body: unknown) =>
    gw.json<Settings & { error?: { code: string; message: string } }>(
      '/api/settings',
      as(token, { method: 'PUT', body: typeof body === 'string' ? body : JSON.stringify(body) }),
    )
  type Model = { id: string; process_id: number; launch_command: string }
  const loadEngine = async (gpu: number): Promise<Model> => {
    const body = { model_path: 'facebook/opt-125m', gpu_ids: [gpu], gpu_memory_utilization: 0.2 }
    const r = await gw.json<{ instance_id: string }>(
      '/api/v1/models/load',
      as(admin, { method: 'POST', body: JSON.stringify(body) }),
    )
    expect(r.status).toBe(202)
    const id = r.body.instance_id
    let last: unknown
    return waitFor(
      `instance ${id} to be active`,
      async () => {
        const m = await gw.json<{ model: Model & { status: string } }>(`/api/v1/models/${id}`, as(admin))
        last = m.body
        if (m.body.model?.status === 'failed')
          throw new Error(`instance ${id} failed: ${JSON.stringify(m.body)}`)
        return m.body.model?.status === 'active' ? m.body.model : undefined
      },
      { timeoutMs: 20_000, wake: (n) => gw.host.bus.on('gateway.instance.status', n), show: () => last },
    )
  }

  beforeAll(boot)
  afterAll(async () => {
    await gw?.stop()
    rmSync(dir, { recursive: true, force: true })
  })

  it('starts with no token; admin-readonly may read but not change it; no token no access', async () => {
    const r = await gw.json<Settings>('/api/settings', as(admin))
    expect(r.status).toBe(200)
    expect(r.body).toMatchObject({ hf_token: null, hf_token_set: false, hf_token_masked: false })
    expect((await gw.json<Settings>('/api/settings', as(readonly))).body.hf_token).toBeNull()
    expect((await gw.json('/api/settings')).status).toBe(401)
    const refused = await put(readonly, { hf_token: TOKEN })
    expect(refused.status).toBe(403)
    expect(refused.body.error?.message).toContain("'admin'")
    expect(
      (await gw.json('/api/settings', { method: 'PUT', body: JSON.stringify({ hf_token: TOKEN }) })).status,
    ).toBe(401)
    expect((await gw.json<Settings>('/api/settings', as(admin))).body.hf_token).toBeNull()
  })

  it('refuses malformed bodies and bad values without echoing them', async () => {
    const bad: unknown[] = [
      '{"hf_token": ',
      {},
      { hf_token: 42 },
      { hf_token: `hf_${'x'.repeat(600)}` },
      { hf_token: 'hf_with space' },
      { hf_token: 'hf_line\nbreak' },
      { hf_token: 'hf_ümlaut' },
      { hf_token: HF_TOKEN_MASK },
    ]
    for (const body of bad) {
      const r = await put(admin, body)
      expect(r.status, JSON.stringify(body)).toBe(400)
      expect(r.body.error?.code).toBe('VALIDATION_ERROR')
      const value = (body as { hf_token?: unknown }).hf_token
      if (typeof value === 'string') expect(r.body.error?.message).not.toContain(value)
    }
    expect((await gw.json<Settings>('/api/settings', as(admin))).body.hf_token).toBeNull()
  })

  it('gives admin the real token and admin-readonly the fixed mask', async () => {
    const set = await put(admin, { hf_token: TOKEN })
    expect(set.status).toBe(200)
    expect(set.body).toMatchObject({ hf_token: TOKEN, hf_token_set: true, hf_token_masked: false })
    expect((await gw.json<Settings>('/api/settings', as(admin))).body.hf_token).toBe(TOKEN)
    const masked = await fetch(`${gw.url}/api/settings`, as(readonly))
    const text = await masked.text()
    expect(text).not.toContain(TOKEN)
    expect(text).not.toContain(TOKEN.slice(3, 12))
    expect(JSON.parse(text)).toMatchObject({
      hf_token: HF_TOKEN_MASK,
      hf_token_set: true,
      hf_token_masked: true,
    })
    expect(HF_TOKEN_MASK).toMatch(/^hf_\*+$/)
  })

  it('keeps the token in a file only the service user can read', () => {
    const file = join(dataDir, 'settings.json')
    expect(statSync(file).mode & 0o777).toBe(0o600)
    expect(readFileSync(file, 'utf8')).toContain(TOKEN)
    expect(readdirSync(dataDir).filter((f) => f.endsWith('.tmp'))).toEqual([])
  })

  let first: Model
  it('gives a newly started engine the token as HF_TOKEN, in its environment only', async () => {
    // modelgate's own secrets in its environment never reach an engine's.
    const secrets = {
      JWT_SECRET: 'jwt-secret-that-must-stay-in-modelgate-0123',
      INFERENCE_API_KEY: 'key-not-for-engines',
    }
    Object.assign(process.env, secrets)
    try {
      first = await loadEngine(0)
    } finally {
      for (const name of Object.keys(secrets)) delete process.env[name]
    }
    const env = engineEnv(first.process_id)
    expect([env.JWT_SECRET, env.INFERENCE_API_KEY]).toEqual([undefined, undefined])
    expect(env.HF_TOKEN).toBe(TOKEN)
    expect(first.launch_command).not.toContain(TOKEN)
    expect(readFileSync(`/proc/${first.process_id}/cmdline`, 'utf8')).not.toContain(TOKEN)
    const detail = await fetch(`${gw.url}/api/v1/models/${first.id}`, as(admin))
    expect(await detail.text()).not.toContain(TOKEN)
  })

  it('gives engines started after a change the new token; earlier ones keep theirs', async () => {
    expect((await put(admin, { hf_token: TOKEN2 })).status).toBe(200)
    const second = await loadEngine(1)
    expect(engineEnv(second.process_id).HF_TOKEN).toBe(TOKEN2)
    expect(engineEnv(first.process_id).HF_TOKEN).toBe(TOKEN)
    const list = await fetch(`${gw.url}/api/v1/models`, as(admin))
    const listed = await list.text()
    expect(listed).not.toContain(TOKEN)
    expect(listed).not.toContain(TOKEN2)
  })

  it('never shows the token in /metrics, event streams, the host log or the engine logs', async () => {
    const metrics = await (await fetch(`${gw.url}/metrics`)).text()
    expect(metrics).toContain('modelgate_')
    const events = await fetch(
      `${gw.url}/api/v1/models/instances/${first.id}/events?types=status,log,progress,memory&replay_logs=true&token=${admin}`,
    )
    const sse = await readSse(events, `instance ${first.id}'s replayed events`, (evs) =>
      evs.some((e) => e.event === 'status'),
    )
    const streamed = JSON.stringify(sse)
    logs.push(...gw.logs)
    const engineLog = engineLogs(dataDir)
    expect(gw.logs.some((l) => l.includes('model-hub token set'))).toBe(true)
    for (const secret of [TOKEN, TOKEN2]) {
      expect(metrics).not.toContain(secret)
      expect(streamed).not.toContain(secret)
      expect(gw.logs.join('\n')).not.toContain(secret)
      expect(engineLog).not.toContain(secret)
    }
  })

  it('keeps the token across a restart, and a cleared token reaches no new engine', async () => {
    await gw.stopKeep()
    logs.push(...gw.logs)
    await boot()
    const r = await gw.json<Settings>('/api/settings', as(admin))
    expect(r.body).toMatchObject({ hf_token: TOKEN2, hf_token_set: true })
    expect((await gw.json<Settings>('/api/settings', as(readonly))).body.hf_token).toBe(HF_TOKEN_MASK)
    const after = await loadEngine(0)
    expect(engineEnv(after.process_id).HF_TOKEN).toBe(TOKEN2)

    const cleared = await put(admin, { hf_token: null })
    expect(cleared.body).toMatchObject({ hf_token: null, hf_token_set: false })
    const bare = await loadEngine(1)
    expect(engineEnv(bare.process_id).HF_TOKEN).not.toBe(TOKEN2)
    expect(statSync(join(dataDir, 'settings.json')).mode & 0o777).toBe(0o600)
    logs.push(...gw.logs)
    expect(logs.some((l) => l.includes('model-hub token removed'))).toBe(true)
    for (const secret of [TOKEN, TOKEN2]) expect(logs.join('\n')).not.toContain(secret)
  })
})
