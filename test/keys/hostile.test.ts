import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { chat, type KeysHost, startKeysHost } from './support.ts'

/**
 * Hostile bodies for the keys API, through the real listener with auth on: each is a 4xx in the
 * controller shape naming what is wrong, never a 500 or a hang, and creates nothing. Reads are open
 * to admin-readonly; writes are admin's.
 */
let h: KeysHost

beforeAll(async () => {
  h = await startKeysHost()
})
afterAll(() => h.stop())

type ErrorBody = { error: { code: string; message: string; statusCode: number } }

async function refused(body: unknown, method = 'POST', path = '/api/keys') {
  const r = await h.admin<ErrorBody>(method, path, body)
  return { status: r.status, code: r.body.error?.code, message: r.body.error?.message ?? '' }
}

describe('inference keys: hostile bodies', () => {
  it('refuses unknown fields, naming each', async () => {
    const r = await refused({ name: 'x', rpm: 5, admin: true, secret: 'mine' })
    expect(r).toMatchObject({ status: 400, code: 'VALIDATION_ERROR' })
    expect(r.message).toContain('admin')
    expect(r.message).toContain('secret')
  })

  it('refuses negative, zero, fractional, huge and mistyped limits', async () => {
    for (const bad of [
      { rpm: -1 },
      { tpm: 0 },
      { max_concurrent: 1.5 },
      { budget_tokens: 1e15 },
      { rpm: 'ten' },
      { rpm: true },
      { priority: 'urgent' },
      { budget_period: 'week' },
      { expires_at: 'tomorrow' },
      { models: 'model-a' },
      { models: [''] },
      { models: [{ name: 'x' }] },
    ]) {
      const r = await refused({ name: 'bad', ...bad })
      expect(r.status, JSON.stringify(bad)).toBe(400)
      expect(r.code).toBe('VALIDATION_ERROR')
    }
    expect((await refused({})).status).toBe(400)
    expect((await refused({ name: '' })).status).toBe(400)
    expect((await refused({ name: '   ' })).status).toBe(400)
    expect((await refused({ name: 'n'.repeat(129) })).status).toBe(400)
  })

  it('refuses a model list longer than 1000, and one too large to read', async () => {
    const long = await refused({ name: 'many', models: Array.from({ length: 1001 }, (_, i) => `m${i}`) })
    expect(long.status).toBe(400)
    // 20 MB of model names: past the admin body limit, refused before it is parsed.
    const huge = await fetch(`${h.url}/api/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${h.token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'huge', models: Array.from({ length: 40_000 }, () => 'x'.repeat(500)) }),
    })
    expect(huge.status).toBe(413)
  })

  it('refuses deep JSON and bodies that are not JSON objects', async () => {
    const deep = `{"name":"deep","models":${'['.repeat(5000)}${']'.repeat(5000)}}`
    const r = await fetch(`${h.url}/api/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${h.token}`, 'content-type': 'application/json' },
      body: deep,
    })
    expect(r.status).toBe(400)
    for (const body of ['[]', '"name"', 'null', '{"name":']) {
      const res = await fetch(`${h.url}/api/keys`, {
        method: 'POST',
        headers: { authorization: `Bearer ${h.token}`, 'content-type': 'application/json' },
        body,
      })
      expect(res.status, body).toBe(400)
    }
  })

  it('refuses the same in a PATCH, and a PATCH or usage query of a key nobody has is 404', async () => {
    const k = await h.createKey({ name: 'patched', rpm: 5 })
    expect((await refused({ rpm: -5 }, 'PATCH', `/api/keys/${k.id}`)).status).toBe(400)
    expect((await refused({ id: 'other' }, 'PATCH', `/api/keys/${k.id}`)).status).toBe(400)
    expect((await refused({ rpm: 6 }, 'PATCH', '/api/keys/key_nobody')).status).toBe(404)
    expect((await h.admin('GET', '/api/keys/key_nobody/usage')).status).toBe(404)
    // Nothing of the refused bodies changed the key, and null removes a limit.
    const same = await h.admin<{ rpm: number | null }>('GET', `/api/keys/${k.id}`)
    expect(same.body.rpm).toBe(5)
    const cleared = await h.admin<{ rpm: number | null }>('PATCH', `/api/keys/${k.id}`, { rpm: null })
    expect(cleared).toMatchObject({ status: 200, body: { rpm: null } })
  })

  it('refuses usage windows it cannot read, and ones too long', async () => {
    expect((await h.admin('GET', '/api/usage?from=yesterday')).status).toBe(400)
    expect((await h.admin('GET', '/api/usage?group_by=pod')).status).toBe(400)
    expect(
      (await h.admin('GET', '/api/usage?from=2026-01-01T00:00:00Z&to=2025-01-01T00:00:00Z')).status,
    ).toBe(400)
    expect(
      (await h.admin('GET', '/api/usage?from=2020-01-01T00:00:00Z&to=2026-01-01T00:00:00Z')).status,
    ).toBe(400)
    expect((await h.admin('GET', '/api/usage?granularity=day&from=2026-06-01T00:00:00Z')).status).toBe(200)
  })

  it('created nothing from any of it: only the keys made on purpose exist, and each still works', async () => {
    const list = await h.admin<{ keys: { name: string }[]; total: number }>('GET', '/api/keys')
    expect(list.body.keys.map((k) => k.name)).toEqual(['patched'])
    expect(list.body.total).toBe(1)
    const k = await h.createKey({ name: 'after-all-that', models: ['model-a'] })
    expect((await chat(h.url, k.key)).status).toBe(200)
  })
})
