import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { waitFor } from '../support/wait.ts'
import { errorOf } from '../wire/support.ts'
import { chat, type KeysHost, startKeysHost } from './support.ts'

/**
 * A key's limits hold under concurrency, through a real listener: N requests at once against
 * `max_concurrent` and `rpm`; a stream that crosses the budget, or whose key is revoked while it
 * runs, finishes whole, and the next request is refused (one beside it waits for the reservation). The stub engine streams only while the
 * test's gate is open, so a test knows which streams are running.
 */
let gate = Promise.withResolvers<void>()
const open = () => gate.resolve()
const close = () => {
  gate = Promise.withResolvers<void>()
}
let h: KeysHost

beforeAll(async () => {
  h = await startKeysHost({ engine: { hold: () => gate.promise } })
})
afterAll(async () => {
  open()
  await h.stop()
})

/** frames: the data lines of an event stream's text. */
const frames = (text: string) => text.split('\n\n').filter((f) => f.startsWith('data: '))

describe('inference keys: limits under concurrency', () => {
  it('max_concurrent: of 8 streams at once, 2 run and 6 get 429; a place frees when one ends', async () => {
    close()
    const k = await h.createKey({ name: 'two-at-once', max_concurrent: 2 })
    const before = h.tally.requests
    const answers = await Promise.all(Array.from({ length: 8 }, () => chat(h.url, k.key, { stream: true })))
    const statuses = answers.map((r) => r.status).sort()
    expect(statuses).toEqual([200, 200, 429, 429, 429, 429, 429, 429])
    for (const r of answers.filter((a) => a.status === 429)) {
      expect(await errorOf(r)).toMatchObject({ code: 'rate_limit_exceeded', type: 'requests' })
      expect(r.headers.get('retry-after')).toBe('1')
    }
    expect(h.tally.requests - before).toBe(2)
    const detail = await h.admin<{ state: { in_flight: number } }>('GET', `/api/keys/${k.id}`)
    expect(detail.body.state.in_flight).toBe(2)
    open()
    for (const r of answers.filter((a) => a.status === 200))
      expect(frames(await r.text()).at(-1)).toBe('data: [DONE]')
    await waitFor('both places free', async () => {
      const d = await h.admin<{ state: { in_flight: number } }>('GET', `/api/keys/${k.id}`)
      return d.body.state.in_flight === 0
    })
    expect((await chat(h.url, k.key)).status).toBe(200)
  })

  it('rpm: of 20 requests at once, exactly 5 go through', async () => {
    open()
    const k = await h.createKey({ name: 'five-a-minute', rpm: 5 })
    const answers = await Promise.all(Array.from({ length: 20 }, () => chat(h.url, k.key)))
    const ok = answers.filter((r) => r.status === 200)
    const refused = answers.filter((r) => r.status === 429)
    expect(ok).toHaveLength(5)
    expect(refused).toHaveLength(15)
    const remaining = ok.map((r) => r.headers.get('x-ratelimit-remaining-requests')).sort()
    expect(remaining).toEqual(['0', '1', '2', '3', '4'])
    for (const r of refused) expect((await errorOf(r)).code).toBe('rate_limit_exceeded')
  })

  it('rpm: a 403 for a model the key does not list uses up none of its requests per minute', async () => {
    open()
    const k = await h.createKey({ name: 'two-a-minute-of-a', rpm: 2, models: ['model-a'] })
    // The key is judged at the head, before the model is known; a refusal for the model gives the place back.
    for (let i = 0; i < 3; i++) {
      const denied = await chat(h.url, k.key, {}, 'model-b')
      expect(denied.status).toBe(403)
      expect((await errorOf(denied)).code).toBe('model_not_allowed')
      // its rate-limit lines say so: no place was used
      expect(denied.headers.get('x-ratelimit-remaining-requests')).toBe('2')
    }
    const first = await chat(h.url, k.key)
    expect(first.status).toBe(200)
    expect(first.headers.get('x-ratelimit-remaining-requests')).toBe('1')
    await first.text()
    expect((await chat(h.url, k.key)).status).toBe(200)
    expect((await chat(h.url, k.key)).status).toBe(429)
  })

  it('a stream that crosses the budget finishes, a request beside it waits for its reservation, the next is 429', async () => {
    close()
    // The stream below uses 5 + 12 = 17 tokens, but reserves its worst case (its prompt's estimate
    // and max_tokens), more than the budget: it may, being the key's only request in flight.
    const k = await h.createKey({ name: 'budget-20', budget_tokens: 20, budget_period: 'month' })
    const running = await chat(h.url, k.key, { stream: true, max_tokens: 12 })
    expect(running.status).toBe(200)
    // Beside it, the rest of the budget is held: refused, with a retry (not insufficient_quota).
    const beside = await chat(h.url, k.key)
    expect(beside.status).toBe(429)
    expect(await errorOf(beside)).toMatchObject({ code: 'rate_limit_exceeded', type: 'tokens' })
    expect(beside.headers.get('retry-after')).toBe('1')
    expect(beside.headers.get('x-should-retry')).toBeNull()
    open()
    const text = await running.text()
    // 12 token chunks and [DONE]: the usage chunk the engine was asked for is not the client's.
    expect(frames(text)).toHaveLength(13)
    expect(text).not.toContain('"usage"')
    await waitFor('the stream ended', async () => {
      const d = await h.admin<{ state: { in_flight: number } }>('GET', `/api/keys/${k.id}`)
      return d.body.state.in_flight === 0
    })
    // 3 tokens are left: a request that may use more begins alone, and crosses the budget.
    const crossing = await chat(h.url, k.key)
    expect(crossing.status).toBe(200)
    await crossing.text()
    const next = await chat(h.url, k.key)
    expect(next.status).toBe(429)
    expect((await errorOf(next)).code).toBe('insufficient_quota')
    const used = await h.admin<{ state: { budget_used: number } }>('GET', `/api/keys/${k.id}`)
    expect(used.body.state.budget_used).toBe(26)
  })

  it('a key revoked while its stream runs: the stream finishes whole, the next request is 401', async () => {
    close()
    const k = await h.createKey({ name: 'revoked-mid-stream' })
    const res = await chat(h.url, k.key, { stream: true, max_tokens: 5 })
    expect(res.status).toBe(200)
    await waitFor('the stream running at the engine', () => h.tally.bodies.some((b) => b.max_tokens === 5))
    expect((await h.admin('DELETE', `/api/keys/${k.id}`)).status).toBe(200)
    const refused = await chat(h.url, k.key)
    expect(refused.status).toBe(401)
    open()
    const text = await res.text()
    expect(frames(text)).toHaveLength(6)
    expect(frames(text).at(-1)).toBe('data: [DONE]')
    // Its usage is still counted (under the revoked key).
    const usage = await h.admin<{ rows: { key_id: string; requests: number; completion_tokens: number }[] }>(
      'GET',
      `/api/keys/${k.id}/usage`,
    )
    expect(usage.body.rows).toEqual([expect.objectContaining({ requests: 1, completion_tokens: 5 })])
  })
})
