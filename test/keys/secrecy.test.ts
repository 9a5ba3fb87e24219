import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { waitFor } from '../support/wait.ts'
import { chat, type KeysHost, startKeysHost } from './support.ts'

/**
 * A key's secret exists in one place after it is made: the answer that created it. Everything else
 * modelgate writes or says is searched for it after the key was used (plain, streamed, refused for
 * its limits, after a change and after its revocation): every log line (debug level), /metrics,
 * every event on the bus, every admin answer about keys and usage, /docs, and the bytes of the
 * database files (WAL included).
 */
let h: KeysHost
const logs: string[] = []
const events: string[] = []

beforeAll(async () => {
  h = await startKeysHost({ logLevel: 'debug', logSink: (l) => logs.push(l) })
  const bus = h.px.host.bus
  const emit = bus.emit.bind(bus)
  bus.emit = ((event: string, payload: unknown) => {
    events.push(`${event} ${JSON.stringify(payload)}`)
    emit(event as never, payload as never)
  }) as typeof bus.emit
})
afterAll(() => h.stop())

describe('inference keys: the secret', () => {
  it('appears nowhere but in the answer that created it', async () => {
    const created = await h.admin<{ id: string; key: string }>('POST', '/api/keys', {
      name: 'secret-keeper',
      rpm: 3,
      models: ['model-a'],
    })
    expect(created.status).toBe(201)
    const { id, key } = created.body
    expect(key).toMatch(/^mg-[A-Za-z0-9_-]{43}$/)
    // Used: plain, streamed, for a model it may not use (which takes none of its rpm), past its rpm.
    expect((await chat(h.url, key)).status).toBe(200)
    expect((await chat(h.url, key, { stream: true })).status).toBe(200)
    expect((await chat(h.url, key, {}, 'model-b')).status).toBe(403)
    expect((await chat(h.url, key)).status).toBe(200)
    const limited = await chat(h.url, key)
    expect(limited.status).toBe(429)
    const answers: string[] = [await limited.text()]
    await h.admin('PATCH', `/api/keys/${id}`, { rpm: null })
    for (const path of ['/api/keys', `/api/keys/${id}`, `/api/keys/${id}/usage`, '/api/usage', '/docs/json'])
      answers.push(JSON.stringify((await h.admin('GET', path)).body))
    await h.admin('DELETE', `/api/keys/${id}`)
    const refused = await chat(h.url, key)
    expect(refused.status).toBe(401)
    answers.push(await refused.text())
    answers.push(await (await fetch(`${h.url}/metrics`)).text())
    await waitFor('the usage written', async () => {
      const u = await h.admin<{ rows: { key_id: string }[] }>('GET', '/api/usage')
      return u.body.rows.some((r) => r.key_id === id)
    })
    expect(events.some((e) => e.includes(id))).toBe(true)
    expect(logs.length).toBeGreaterThan(0)
    for (const text of [...answers, ...logs, ...events]) expect(text).not.toContain(key)
    // Nor any long part of it (a prefix or suffix of a third of it).
    const third = key.slice(3, 3 + 15)
    for (const text of [...answers, ...logs, ...events]) expect(text).not.toContain(third)
    for (const file of readdirSync(h.px.dataDir)) {
      const bytes = readFileSync(join(h.px.dataDir, file))
      expect(bytes.includes(Buffer.from(key)), file).toBe(false)
      expect(bytes.includes(Buffer.from(third)), file).toBe(false)
    }
  })
})
