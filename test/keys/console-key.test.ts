import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { chat, type KeysHost, startKeysHost } from './support.ts'

/**
 * The dashboard's own inference key, through real sockets with admin auth on and no INFERENCE_API_KEY:
 * once a key is made through /api/keys, inference needs a key and the dashboard's chat is given one
 * the process made for itself (it worked before only with the static key: "Missing API key" for
 * good after the first POST /api/keys). It is refused to nobody an admin is not, is counted as the
 * static key, and keeps working after every API key is deleted (inference stays closed).
 */
let h: KeysHost

beforeAll(async () => {
  h = await startKeysHost()
})
afterAll(() => h.stop())

const consoleKey = async () => {
  const r = await h.admin<{ required: boolean; key: string | null }>('GET', '/api/dashboard/inference-key')
  expect(r.status).toBe(200)
  return r.body
}

describe("the dashboard's inference key", () => {
  it('is none while inference is open', async () => {
    expect(await consoleKey()).toEqual({ required: false, key: null })
    expect((await chat(h.url, null)).status).toBe(200)
  })

  it('is given once a key made through the API closes inference, and is served', async () => {
    const made = await h.createKey({ name: 'first' })
    const given = await consoleKey()
    expect(given.required).toBe(true)
    expect(typeof given.key).toBe('string')
    expect(given.key).not.toBe(made.key)
    expect((await chat(h.url, null)).status).toBe(401)
    const res = await chat(h.url, given.key)
    expect(res.status).toBe(200)
    // No key of its own: no limits, no rate-limit lines.
    expect([...res.headers.keys()].some((n) => n.startsWith('x-ratelimit-'))).toBe(false)
    // A near miss of it is an unknown key.
    const near = `${given.key!.slice(0, -1)}${given.key!.endsWith('A') ? 'B' : 'A'}`
    expect((await chat(h.url, near)).status).toBe(401)
  })

  it('is counted as the static key in the usage', async () => {
    const { key } = await consoleKey()
    expect((await chat(h.url, key)).status).toBe(200)
    const usage = await h.admin<{ rows: { key_id?: string; requests: number; completion_tokens: number }[] }>(
      'GET',
      '/api/usage?group_by=key',
    )
    expect(usage.status).toBe(200)
    const own = usage.body.rows.filter((r) => r.key_id === 'static')
    expect(own.reduce((n, r) => n + r.requests, 0)).toBeGreaterThanOrEqual(2)
    expect(own.reduce((n, r) => n + r.completion_tokens, 0)).toBeGreaterThan(0)
  })

  it('keeps working once every API key is deleted: inference stays closed, the chat stays open', async () => {
    const list = await h.admin<{ keys: { id: string }[] }>('GET', '/api/keys')
    for (const k of list.body.keys) expect((await h.admin('DELETE', `/api/keys/${k.id}`)).status).toBe(200)
    const given = await consoleKey()
    expect(given.required).toBe(true)
    expect((await chat(h.url, null)).status).toBe(401)
    expect((await chat(h.url, given.key)).status).toBe(200)
  })

  it('is not given without an admin token', async () => {
    const anon = await fetch(`${h.url}/api/dashboard/inference-key`)
    expect(anon.status).toBe(401)
    expect(await anon.text()).not.toContain('mg-console-')
  })
})
