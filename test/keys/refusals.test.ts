import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { errorOf } from '../wire/support.ts'
import { chat, type KeysHost, startKeysHost } from './support.ts'

/**
 * Inference keys through a real listener with auth on: every refusal with OpenAI's status, code and
 * headers (so OpenAI's clients react as they do with OpenAI), and the `x-ratelimit-*` lines on every
 * answer to a key with limits. The static INFERENCE_API_KEY stays an unlimited key.
 */
const STATIC = 'static-inference-key-for-tests'
let h: KeysHost

beforeAll(async () => {
  h = await startKeysHost({ env: { INFERENCE_API_KEY: STATIC } })
})
afterAll(() => h.stop())

const ratelimit = (res: Response) =>
  Object.fromEntries([...res.headers].filter(([n]) => n.startsWith('x-ratelimit-')))

describe('inference keys: refusals', () => {
  it('401 missing_api_key without a key, 401 invalid_api_key for one nobody has', async () => {
    const none = await chat(h.url, null)
    expect(none.status).toBe(401)
    expect(await errorOf(none)).toMatchObject({ code: 'missing_api_key', type: 'authentication_error' })
    const wrong = await chat(h.url, `mg-${'A'.repeat(43)}`)
    expect(wrong.status).toBe(401)
    const error = await errorOf(wrong)
    expect(error).toMatchObject({ code: 'invalid_api_key', message: 'Invalid API key' })
  })

  it('the static INFERENCE_API_KEY is an unlimited key: no limits, no rate-limit lines', async () => {
    for (let i = 0; i < 3; i++) {
      const res = await chat(h.url, STATIC)
      expect(res.status).toBe(200)
      expect(ratelimit(res)).toEqual({})
      await res.text()
    }
  })

  it('401 invalid_api_key for a revoked key, from its next request on', async () => {
    const k = await h.createKey({ name: 'to-revoke' })
    expect((await chat(h.url, k.key)).status).toBe(200)
    const revoked = await h.admin('DELETE', `/api/keys/${k.id}`)
    expect(revoked).toEqual({ status: 200, body: { id: k.id, revoked: true } })
    const res = await chat(h.url, k.key)
    expect(res.status).toBe(401)
    expect((await errorOf(res)).code).toBe('invalid_api_key')
    expect((await h.admin('GET', `/api/keys/${k.id}`)).status).toBe(404)
    expect((await h.admin('DELETE', `/api/keys/${k.id}`)).status).toBe(404)
  })

  it('401 invalid_api_key for an expired key', async () => {
    const past = await h.createKey({ name: 'expired', expires_at: new Date(Date.now() - 1000).toISOString() })
    const res = await chat(h.url, past.key)
    expect(res.status).toBe(401)
    expect((await errorOf(res)).code).toBe('invalid_api_key')
    const future = await h.createKey({
      name: 'valid',
      expires_at: new Date(Date.now() + 3_600_000).toISOString(),
    })
    expect((await chat(h.url, future.key)).status).toBe(200)
    // Expiring a key by PATCH takes effect at once.
    await h.admin('PATCH', `/api/keys/${future.id}`, { expires_at: new Date(Date.now() - 1).toISOString() })
    expect((await chat(h.url, future.key)).status).toBe(401)
  })

  it('403 model_not_allowed for a model the key does not list, with its rate-limit lines', async () => {
    const k = await h.createKey({ name: 'only-a', models: ['model-a'], rpm: 100 })
    expect((await chat(h.url, k.key, {}, 'model-a')).status).toBe(200)
    const res = await chat(h.url, k.key, {}, 'model-b')
    expect(res.status).toBe(403)
    expect(await errorOf(res)).toMatchObject({ code: 'model_not_allowed', param: 'model' })
    expect(ratelimit(res)['x-ratelimit-limit-requests']).toBe('100')
    // The engine never saw it.
    expect(h.tally.bodies.filter((b) => b.model === 'model-b')).toHaveLength(0)
    // Nor through the direct proxy, which bypasses model routing: the engine's served name must be allowed.
    const direct = await fetch(`${h.url}/api/direct/${h.stub.port}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${k.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'model-a', messages: [] }),
    })
    // Port `stub.port` serves both names; the first instance on it is `m` (model-a).
    expect(direct.status).toBe(200)
    const only = await h.createKey({ name: 'only-b', models: ['model-b'] })
    const denied = await fetch(`${h.url}/api/direct/${h.stub.port}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${only.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'model-a', messages: [] }),
    })
    expect(denied.status).toBe(403)
  })

  it('counts refused requests in the key’s usage, by reason: the 429s of its head and the 403 of its model', async () => {
    const k = await h.createKey({ name: 'refusals-counted', rpm: 1, models: ['model-a'] })
    expect((await chat(h.url, k.key, {}, 'model-b')).status).toBe(403)
    const ok = await chat(h.url, k.key)
    expect(ok.status).toBe(200)
    await ok.text()
    for (let i = 0; i < 3; i++) expect((await chat(h.url, k.key)).status).toBe(429)
    type Row = { model: string; requests: number; errors: number; prompt_tokens: number }
    const own = await h.admin<{ rows: Row[] }>('GET', `/api/keys/${k.id}/usage`)
    const by = Object.fromEntries(
      own.body.rows.map((r) => [r.model, [r.requests, r.errors, r.prompt_tokens]]),
    )
    expect(by).toEqual({
      'model-a': [1, 0, expect.any(Number)],
      '(refused: model)': [1, 1, 0],
      '(refused: requests)': [3, 3, 0],
    })
    const all = await h.admin<{ rows: (Row & { key_id: string })[] }>('GET', '/api/usage?group_by=key')
    expect(all.body.rows.find((r) => r.key_id === k.id)).toMatchObject({ requests: 5, errors: 4 })
  })

  it('429 rate_limit_exceeded (requests) past rpm, with Retry-After and the request lines', async () => {
    const k = await h.createKey({ name: 'rpm-3', rpm: 3 })
    const seen: Record<string, string>[] = []
    for (let i = 0; i < 3; i++) {
      const res = await chat(h.url, k.key)
      expect(res.status).toBe(200)
      seen.push(ratelimit(res))
      await res.text()
    }
    expect(seen.map((s) => s['x-ratelimit-remaining-requests'])).toEqual(['2', '1', '0'])
    expect(seen[0]!['x-ratelimit-limit-requests']).toBe('3')
    expect(seen[0]!['x-ratelimit-reset-requests']).toBe('20s')
    const res = await chat(h.url, k.key)
    expect(res.status).toBe(429)
    expect(await errorOf(res)).toMatchObject({ code: 'rate_limit_exceeded', type: 'requests' })
    expect(res.headers.get('retry-after')).toBe('20')
    expect(ratelimit(res)).toMatchObject({
      'x-ratelimit-limit-requests': '3',
      'x-ratelimit-remaining-requests': '0',
    })
  })

  it('429 rate_limit_exceeded (tokens) once the minute’s tokens are spent, with the token lines', async () => {
    // One request uses 5 prompt + 4 completion tokens (the stub engine's count): the bucket of 8 is empty.
    const k = await h.createKey({ name: 'tpm-8', tpm: 8 })
    const first = await chat(h.url, k.key)
    expect(first.status).toBe(200)
    expect(ratelimit(first)).toMatchObject({
      'x-ratelimit-limit-tokens': '8',
      'x-ratelimit-remaining-tokens': '8',
    })
    await first.text()
    const res = await chat(h.url, k.key)
    expect(res.status).toBe(429)
    expect(await errorOf(res)).toMatchObject({ code: 'rate_limit_exceeded', type: 'tokens' })
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    expect(ratelimit(res)['x-ratelimit-remaining-tokens']).toBe('0')
  })

  it('429 insufficient_quota once the budget is spent, telling OpenAI’s clients not to retry', async () => {
    const k = await h.createKey({ name: 'budget-10', budget_tokens: 10, budget_period: 'day' })
    expect((await chat(h.url, k.key)).status).toBe(200)
    // 9 of 10 used: one more request may start, and it crosses the budget.
    expect((await chat(h.url, k.key)).status).toBe(200)
    const res = await chat(h.url, k.key)
    expect(res.status).toBe(429)
    const error = await errorOf(res)
    expect(error).toMatchObject({ code: 'insufficient_quota', type: 'insufficient_quota' })
    expect(error.message).toContain('renews at')
    expect(res.headers.get('x-should-retry')).toBe('false')
    const detail = await h.admin<{ state: { budget_used: number } }>('GET', `/api/keys/${k.id}`)
    expect(detail.body.state.budget_used).toBe(18)
    // Raising the budget lets it go on.
    await h.admin('PATCH', `/api/keys/${k.id}`, { budget_tokens: 1000 })
    expect((await chat(h.url, k.key)).status).toBe(200)
  })

  it('rate-limit lines on every answer: a stream, a 400 before any model, a 404 model', async () => {
    const k = await h.createKey({ name: 'lines', rpm: 1000, tpm: 100_000 })
    const stream = await chat(h.url, k.key, { stream: true })
    expect(stream.status).toBe(200)
    expect(Object.keys(ratelimit(stream)).sort()).toEqual([
      'x-ratelimit-limit-requests',
      'x-ratelimit-limit-tokens',
      'x-ratelimit-remaining-requests',
      'x-ratelimit-remaining-tokens',
      'x-ratelimit-reset-requests',
      'x-ratelimit-reset-tokens',
    ])
    await stream.text()
    const bad = await fetch(`${h.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${k.key}`, 'content-type': 'application/json' },
      body: '{not json',
    })
    expect(bad.status).toBe(400)
    expect(ratelimit(bad)['x-ratelimit-limit-requests']).toBe('1000')
    const unknown = await chat(h.url, k.key, {}, 'no-such-model')
    expect(unknown.status).toBe(400)
    expect(ratelimit(unknown)['x-ratelimit-limit-tokens']).toBe('100000')
    const models = await fetch(`${h.url}/v1/models`, { headers: { authorization: `Bearer ${k.key}` } })
    expect(models.status).toBe(200)
    expect(ratelimit(models)['x-ratelimit-limit-requests']).toBe('1000')
  })
})
