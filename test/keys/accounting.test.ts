import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { statSync } from 'node:fs'
import { join } from 'node:path'
import { waitFor } from '../support/wait.ts'
import { chat, type KeysHost, startKeysHost } from './support.ts'

/**
 * What a key is charged, and that its token limits hold, through real sockets with auth on: a stream
 * the client leaves before its end is charged what reached it; `stream` as the engine's lax parsing
 * reads it still gets the engine's count; requests running at once can pass a token limit by one
 * request at most; and a model name nobody serves leaves nothing behind.
 */

/** The stub engine's pace: each chunk after the first waits for one `step()` (or all, `open`). */
const gate = {
  waiting: [] as (() => void)[],
  open: true,
  hold(): Promise<void> {
    if (gate.open) return Promise.resolve()
    return new Promise((resolve) => gate.waiting.push(resolve))
  },
  step(): void {
    gate.waiting.shift()?.()
  },
  release(): void {
    gate.open = true
    for (const r of gate.waiting.splice(0)) r()
  },
}

let h: KeysHost
beforeAll(async () => {
  h = await startKeysHost({ engine: { hold: () => gate.hold() } })
})
afterAll(async () => {
  gate.release()
  await h.stop()
})

interface KeyDetail {
  state: { in_flight: number; budget_used: number | null }
}

const detail = async (id: string) => (await h.admin<KeyDetail>('GET', `/api/keys/${id}`)).body

/** settled: the key has no request in flight (its ends are counted), and its detail then. */
const settled = (id: string) =>
  waitFor(`key ${id} idle`, async () => {
    const d = await detail(id)
    return d.state.in_flight === 0 && d
  })

/** outputEvents: the `data: {…}` events of an SSE text that carry choices (not the usage chunk). */
function outputEvents(text: string): number {
  return text.split('\n\n').filter((e) => e.startsWith('data: {') && !e.includes('"choices":[]')).length
}

/**
 * abandon: a stream of `maxTokens` for key `id` from which the client reads `read` output events and
 * then resets the connection; once the key has no request in flight, what it read and the body's size.
 */
async function abandon(
  id: string,
  key: string,
  maxTokens: number,
  read: number,
): Promise<{ events: number; bytes: number; refused?: { status: number; code?: string } }> {
  gate.open = false
  const ctl = new AbortController()
  const body = {
    model: 'model-a',
    messages: [{ role: 'user', content: 'tell me everything' }],
    max_tokens: maxTokens,
    stream: true,
  }
  const res = await fetch(`${h.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify(body),
    signal: ctl.signal,
  })
  if (res.status !== 200) {
    const code = ((await res.json()) as { error?: { code?: string } }).error?.code
    gate.release()
    return { events: 0, bytes: 0, refused: { status: res.status, ...(code ? { code } : {}) } }
  }
  const reader = res.body!.getReader()
  const dec = new TextDecoder()
  let text = ''
  while (outputEvents(text) < read) {
    gate.step()
    const { value, done } = await reader.read()
    if (done) throw new Error('the stream ended before the client left it')
    text += dec.decode(value, { stream: true })
  }
  ctl.abort()
  await reader.cancel().catch(() => {})
  // The engine stays held until the gateway has ended the request (its client gone), so nothing more
  // of the stream can pass meanwhile.
  await settled(id)
  gate.release()
  return { events: outputEvents(text), bytes: JSON.stringify(body).length }
}

describe('inference keys: every token a client receives is charged', () => {
  it('charges a stream the client leaves before its end for what reached it', async () => {
    const { id, key } = await h.createKey({ name: 'leaver', budget_tokens: 100_000 })
    const { events, bytes } = await abandon(id, key, 40, 10)
    const d = await settled(id)
    const used = d.state.budget_used ?? 0
    // The completion: every event that reached the client, and at most one more that was on its way.
    // The prompt: the estimate from the body (the engine's count never came), a few dozen tokens.
    expect(used).toBeGreaterThanOrEqual(events)
    expect(used).toBeLessThanOrEqual(events + 1 + Math.ceil((bytes + 64) / 4))
    const usage = await h.admin<{ rows: { model: string; completion_tokens: number }[] }>(
      'GET',
      `/api/keys/${id}/usage`,
    )
    const row = usage.body.rows.find((r) => r.model === 'model-a')
    expect(row?.completion_tokens).toBeGreaterThanOrEqual(events)
    expect(row?.completion_tokens).toBeLessThanOrEqual(events + 1)
  })

  it('refuses a key whose budget left streams used up, instead of serving it for free', async () => {
    const { id, key } = await h.createKey({ name: 'serial-leaver', budget_tokens: 150 })
    let delivered = 0
    let refusal: { status: number; code?: string } | null = null
    for (let i = 0; i < 25 && refusal === null; i++) {
      const left = await abandon(id, key, 30, 10)
      if (left.refused) refusal = left.refused
      else delivered += left.events
      await settled(id)
    }
    expect(refusal).toEqual({ status: 429, code: 'insufficient_quota' })
    // Walked past by at most the one stream that began while some budget was left.
    expect(delivered).toBeLessThanOrEqual(150 + 30)
  })

  for (const stream of [1, 'true', 'YES'] as const) {
    it(`counts the engine's own tokens of a stream sent as "stream": ${JSON.stringify(stream)}`, async () => {
      const { id, key } = await h.createKey({ name: `lax-${String(stream)}`, budget_tokens: 100_000 })
      const before = { ...h.tally }
      const res = await chat(h.url, key, { stream, max_tokens: 7 })
      expect(res.status).toBe(200)
      const text = await res.text()
      // The engine streamed (as vLLM reads the flag), and the client, who did not ask, got no usage chunk.
      expect(outputEvents(text)).toBe(7)
      expect(text).not.toContain('"usage"')
      const d = await settled(id)
      const engine = h.tally.prompt - before.prompt + (h.tally.completion - before.completion)
      expect(d.state.budget_used).toBe(engine)
    })
  }
})

describe('inference keys: token limits hold under concurrency', () => {
  /** burst: `n` requests at once, held by the engine until all have been answered or refused. */
  async function burst(key: string, n: number, maxTokens: number): Promise<number[]> {
    gate.open = false
    const pending = Array.from({ length: n }, () => chat(h.url, key, { max_tokens: maxTokens }))
    // Refusals come at once; the admitted ones wait for the engine (released below).
    const statuses: number[] = []
    const settledAll = Promise.all(
      pending.map(async (p) => {
        const r = await p
        statuses.push(r.status)
        await r.text()
      }),
    )
    await waitFor('the refused answered', () => statuses.filter((s) => s === 429).length >= n - 2)
    gate.release()
    await settledAll
    return statuses
  }

  it('lets 50 requests at once pass a budget by at most one request', async () => {
    const { id, key } = await h.createKey({ name: 'budget-burst', budget_tokens: 300 })
    const statuses = await burst(key, 50, 200)
    const d = await settled(id)
    const served = statuses.filter((s) => s === 200).length
    expect(served).toBeGreaterThanOrEqual(1)
    // One request's reservation: its max_tokens and its prompt's estimate (under 100 tokens here).
    expect(d.state.budget_used!).toBeLessThanOrEqual(300 + 200 + 100)
    expect(served).toBeLessThanOrEqual(2)
  })

  it('lets 50 requests at once pass a tpm by at most one request', async () => {
    const { id, key } = await h.createKey({ name: 'tpm-burst', tpm: 200 })
    const before = { ...h.tally }
    const statuses = await burst(key, 50, 200)
    await settled(id)
    const spent = h.tally.prompt - before.prompt + (h.tally.completion - before.completion)
    expect(statuses.filter((s) => s === 200).length).toBe(1)
    expect(spent).toBeLessThanOrEqual(200 + 200 + 100)
    const refusal = statuses.filter((s) => s === 429).length
    expect(refusal).toBe(49)
  })
})

describe('inference keys: nothing a client sends becomes unbounded state', () => {
  it('leaves the database the same size after requests naming 1 MB models', async () => {
    const { key } = await h.createKey({ name: 'long-names' })
    const db = join(h.px.dataDir, 'modelgate.db')
    const size = () => statSync(db).size + (statSync(`${db}-wal`, { throwIfNoEntry: false })?.size ?? 0)
    // The usage of one refused request is written first, so the rows it needs exist.
    expect((await chat(h.url, key, {}, 'x'.repeat(16))).status).toBeGreaterThanOrEqual(400)
    await h.admin('GET', '/api/usage')
    const before = size()
    for (let i = 0; i < 20; i++) {
      const res = await chat(h.url, key, {}, `${i}-${'m'.repeat(1 << 20)}`)
      expect(res.status).toBeGreaterThanOrEqual(400)
      expect(res.status).toBeLessThan(500)
      await res.text()
    }
    const usage = await h.admin<{ rows: { model: string; requests: number; errors: number }[] }>(
      'GET',
      '/api/usage?group_by=model',
    )
    expect(usage.status).toBe(200)
    for (const r of usage.body.rows) expect(r.model.length).toBeLessThan(64)
    const refused = usage.body.rows.find((r) => r.model === '(refused)')
    expect(refused?.errors).toBeGreaterThanOrEqual(21)
    expect(size() - before).toBeLessThan(256 * 1024)
  })

  it('pages the usage API, each row once, and refuses a cursor it did not give', async () => {
    for (let i = 0; i < 5; i++) {
      const { key } = await h.createKey({ name: `pager-${i}` })
      expect((await chat(h.url, key)).status).toBe(200)
    }
    const all = await h.admin<{ rows: { key_id: string; start: string }[]; next_cursor: string | null }>(
      'GET',
      '/api/usage',
    )
    expect(all.body.next_cursor).toBeNull()
    const seen: string[] = []
    let cursor: string | null = null
    let pages = 0
    do {
      const q: string = cursor === null ? '' : `&cursor=${cursor}`
      const page = await h.admin<{ rows: { key_id: string; start: string }[]; next_cursor: string | null }>(
        'GET',
        `/api/usage?limit=2${q}`,
      )
      expect(page.status).toBe(200)
      expect(page.body.rows.length).toBeLessThanOrEqual(2)
      for (const r of page.body.rows) seen.push(`${r.start} ${r.key_id}`)
      cursor = page.body.next_cursor
      pages++
    } while (cursor !== null && pages < 100)
    expect(seen).toEqual(all.body.rows.map((r) => `${r.start} ${r.key_id}`))
    expect(pages).toBeGreaterThanOrEqual(3)
    const bad = await h.admin<{ error: string }>('GET', '/api/usage?cursor=not-a-cursor')
    expect(bad.status).toBe(400)
    const tooMany = await h.admin('GET', '/api/usage?limit=1000000')
    expect(tooMany.status).toBe(400)
  })
})
