import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Usage is the engine's own count: the gateway drives a real simulated vLLM (its `usage`, and its
 * Prometheus counters `vllm:prompt_tokens_total` and `vllm:generation_tokens_total`), auth on. After
 * a mix of plain and streamed requests by two keys (streams that asked for the usage chunk and
 * streams that did not), the keys' usage adds up to exactly what the engine counted, a stream that
 * did not ask never shows the chunk, and the usage is the same after a restart.
 */
const PASSWORD = 'usage-test-password'
const ENV = { AUTH_MODE: 'simple', ADMIN_PASSWORD: PASSWORD, JWT_SECRET: 'u'.repeat(40) }
const PORTS: [number, number] = [24310, 24319]

let gw: TestGateway
let token = ''
let enginePort = 0

async function admin<T = Record<string, unknown>>(method: string, path: string, body?: unknown) {
  const r = await gw.json<T>(path, {
    method,
    headers: { authorization: `Bearer ${token}` },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  return r
}

async function login(): Promise<void> {
  const r = await gw.json<{ token: string }>('/api/auth/login', {
    method: 'POST',
    body: JSON.stringify({ username: 'admin', password: PASSWORD }),
  })
  token = r.body.token
}

beforeAll(async () => {
  gw = await startGateway({ ports: PORTS, hostEnv: ENV, env: { SIM_TOKENS_PER_SEC: '2000' } })
  await login()
  const load = await admin<{ instance_id: string }>('POST', '/api/v1/models/load', {
    model_path: 'org/usage-model',
    served_model_name: 'usage-model',
    gpu_ids: [0],
  })
  expect(load.status).toBe(202)
  const id = load.body.instance_id
  await waitFor('the model active', async () => {
    const r = await admin<{ model: { status: string; port: number } }>('GET', `/api/v1/models/${id}`)
    if (r.body.model.status !== 'active') return false
    enginePort = r.body.model.port
    return true
  })
}, 60_000)

afterAll(() => gw?.stop(), 30_000)

/** engineCounts: the engine's own token counters. */
async function engineCounts(): Promise<{ prompt: number; completion: number }> {
  const text = await (await fetch(`http://127.0.0.1:${enginePort}/metrics`)).text()
  const value = (name: string) =>
    Number(new RegExp(`^${name}\\{[^}]*\\} ([0-9.e+]+)$`, 'm').exec(text)?.[1] ?? Number.NaN)
  return { prompt: value('vllm:prompt_tokens_total'), completion: value('vllm:generation_tokens_total') }
}

interface Row {
  start: string
  key_id?: string
  key_name?: string
  model?: string
  requests: number
  prompt_tokens: number
  completion_tokens: number
  errors: number
}

function totals(rows: Row[]) {
  return rows.reduce(
    (a, r) => ({
      requests: a.requests + r.requests,
      prompt: a.prompt + r.prompt_tokens,
      completion: a.completion + r.completion_tokens,
    }),
    { requests: 0, prompt: 0, completion: 0 },
  )
}

function send(key: string, body: Record<string, unknown>): Promise<Response> {
  return fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'usage-model',
      messages: [{ role: 'user', content: 'count my tokens' }],
      ...body,
    }),
  })
}

describe('inference keys: usage from the engine’s own counts', () => {
  let usageBefore: Row[] = []

  it('adds up to what the engine counted, over plain and streamed requests of two keys', async () => {
    const before = await engineCounts()
    const a = (await admin<{ id: string; key: string }>('POST', '/api/keys', { name: 'usage-a' })).body
    const b = (await admin<{ id: string; key: string }>('POST', '/api/keys', { name: 'usage-b' })).body
    const requests: [string, Record<string, unknown>][] = [
      [a.key, { max_tokens: 7 }],
      [a.key, { max_tokens: 11, stream: true }],
      [b.key, { max_tokens: 5, stream: true, stream_options: { include_usage: true } }],
      [b.key, { max_tokens: 9 }],
      [a.key, { max_tokens: 3, stream: true, stream_options: { continuous_usage_stats: false } }],
      [b.key, { max_tokens: 13, stream: true }],
    ]
    for (const [key, body] of requests) {
      const res = await send(key, body)
      expect(res.status).toBe(200)
      const text = await res.text()
      const asked = (body.stream_options as { include_usage?: boolean } | undefined)?.include_usage === true
      // A stream shows the usage chunk only when its client asked for it; a plain reply always has usage.
      if (body.stream) expect(text.includes('"usage"')).toBe(asked)
      else expect(JSON.parse(text).usage.completion_tokens).toBeGreaterThan(0)
    }
    const after = await engineCounts()
    const usage = await admin<{ rows: Row[] }>('GET', '/api/usage?group_by=key')
    usageBefore = usage.body.rows
    const mine = usage.body.rows.filter((r) => r.key_id === a.id || r.key_id === b.id)
    expect(totals(mine)).toEqual({
      requests: requests.length,
      prompt: after.prompt - before.prompt,
      completion: after.completion - before.completion,
    })
    expect(mine.map((r) => r.key_name).sort()).toEqual(['usage-a', 'usage-b'])
    // By model, and one key's own rows.
    const byModel = await admin<{ rows: Row[] }>('GET', '/api/usage?group_by=model')
    expect(byModel.body.rows.find((r) => r.model === 'usage-model')?.requests).toBe(requests.length)
    const own = await admin<{ rows: Row[] }>('GET', `/api/keys/${a.id}/usage?granularity=day`)
    expect(totals(own.body.rows).requests).toBe(3)
    expect(own.body.rows[0]!.start).toMatch(/T00:00:00\.000Z$/)
  })

  it('is the same after a restart', async () => {
    await gw.stopKeep()
    gw = await startGateway({
      ports: PORTS,
      hostEnv: ENV,
      dataDir: gw.dataDir,
      simDir: gw.simDir,
      env: { SIM_TOKENS_PER_SEC: '2000' },
    })
    await login()
    const usage = await admin<{ rows: Row[] }>('GET', '/api/usage?group_by=key')
    expect(usage.body.rows).toEqual(usageBefore)
  }, 60_000)
})
