import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { cleanupSims } from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'
import { startRouterWithGateway, type TestRouter } from './support.ts'

/**
 * The router's listener charges a key as the gateway's does, through a real gateway and its simulated
 * vLLM: a stream the client resets before its end is charged what reached it (the engine's count
 * never comes), and `"stream": "true"` gets the engine's own count.
 */
const GW = 'gw-metered'

let r: TestRouter & { simDir: string }
let instanceId = ''

const admin = <T = Record<string, unknown>>(path: string, init?: RequestInit) => r.main<T>(path, init)

beforeAll(async () => {
  r = await startRouterWithGateway([18870, 18879], 'from_gateway: true\n')
  const load = await admin<{ instance_id: string }>('/api/v1/models/load', {
    method: 'POST',
    body: JSON.stringify({
      model_path: 'org/gw-metered-base',
      served_model_name: GW,
      enable_sleep_mode: true,
    }),
  })
  expect(load.status).toBe(202)
  instanceId = load.body.instance_id
  await waitFor(
    'instance active',
    async () =>
      (await admin<{ model: { status: string } }>(`/api/v1/models/${instanceId}`)).body.model.status ===
      'active',
    { timeoutMs: 20_000 },
  )
})

afterAll(async () => {
  await r?.stop()
  cleanupSims()
})

interface KeyState {
  state: { in_flight: number; budget_used: number | null }
}

const idle = (id: string) =>
  waitFor(`key ${id} idle`, async () => {
    const d = (await admin<KeyState>(`/api/keys/${id}`)).body
    return d.state.in_flight === 0 && d
  })

const events = (text: string) =>
  text.split('\n\n').filter((e) => e.startsWith('data: {') && !e.includes('"choices":[]')).length

describe('router: a key is charged for what its client received', () => {
  it('charges a stream the client resets before its end', async () => {
    const made = await admin<{ id: string; key: string }>('/api/keys', {
      method: 'POST',
      body: JSON.stringify({ name: 'router-leaver', budget_tokens: 100_000 }),
    })
    expect(made.status).toBe(201)
    const { id, key } = made.body
    const ctl = new AbortController()
    const res = await fetch(`${r.routerUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
      body: JSON.stringify({
        model: GW,
        messages: [{ role: 'user', content: 'a long answer please' }],
        max_tokens: 2000,
        ignore_eos: true,
        stream: true,
      }),
      signal: ctl.signal,
    })
    expect(res.status).toBe(200)
    const reader = res.body!.getReader()
    const dec = new TextDecoder()
    let text = ''
    while (events(text) < 5) {
      const { value, done } = await reader.read()
      if (done) throw new Error('the stream ended before the client left it')
      text += dec.decode(value, { stream: true })
    }
    ctl.abort()
    await reader.cancel().catch(() => {})
    const d = await idle(id)
    // At least what the client read; far less than the whole answer (the engine was stopped with it).
    expect(d.state.budget_used!).toBeGreaterThanOrEqual(events(text))
    expect(d.state.budget_used!).toBeLessThan(2000)
  })

  it('counts the engine’s tokens of a stream sent as "stream": "true"', async () => {
    const made = await admin<{ id: string; key: string }>('/api/keys', {
      method: 'POST',
      body: JSON.stringify({ name: 'router-lax', budget_tokens: 100_000 }),
    })
    const { id, key } = made.body
    const res = await fetch(`${r.routerUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
      body: JSON.stringify({
        model: GW,
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 9,
        ignore_eos: true,
        stream: 'true',
      }),
    })
    expect(res.status).toBe(200)
    const text = await res.text()
    expect(events(text)).toBeGreaterThanOrEqual(9)
    expect(text).not.toContain('"usage"')
    const d = await idle(id)
    const usage = await admin<{
      rows: { model: string; prompt_tokens: number; completion_tokens: number }[]
    }>(`/api/keys/${id}/usage`)
    const row = usage.body.rows.find((x) => x.model === GW)
    // The engine's own count: exactly the 9 tokens asked for, and its prompt count.
    expect(row?.completion_tokens).toBe(9)
    expect(d.state.budget_used).toBe(row!.prompt_tokens + 9)
  })
})

describe('router: a key acts only on the models it lists', () => {
  it('refuses to sleep or wake a model with a key for another one (403), and sleeps it with its own', async () => {
    const make = async (name: string, models: string[]) =>
      (
        await admin<{ id: string; key: string }>('/api/keys', {
          method: 'POST',
          body: JSON.stringify({ name, models }),
        })
      ).body.key
    const other = await make('router-other-model', ['some-other-model'])
    const own = await make('router-own-model', [GW])
    const status = async () =>
      (await r.get<{ models: Record<string, { status: string }> }>('/sleep/status')).body.models[GW]?.status
    expect(await status()).toBe('active')
    const bearer = (key: string) => ({ authorization: `Bearer ${key}` })
    const slept = await r.post<{ error: { code: string } }>(`/action/sleep/${GW}`, {}, bearer(other))
    expect(slept.status).toBe(403)
    expect(slept.body.error.code).toBe('model_not_allowed')
    expect(await status()).toBe('active')
    const ok = await r.post(`/action/sleep/${GW}`, {}, bearer(own))
    expect(ok.status).toBe(200)
    await waitFor('asleep', async () => (await status()) === 'sleeping', { timeoutMs: 20_000 })
    const woken = await r.post<{ error: { code: string } }>(`/action/wakeup/${GW}`, {}, bearer(other))
    expect(woken.status).toBe(403)
    expect(woken.body.error.code).toBe('model_not_allowed')
    expect(await status()).toBe('sleeping')
  })
})
