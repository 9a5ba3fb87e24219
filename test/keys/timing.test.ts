import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { resolve } from 'node:path'
import { chat, type KeysHost, startKeysHost } from './support.ts'

/**
 * Wrong keys cost the one who sends them: a flood of wrong keys (a separate process, each on its
 * own connection) is refused from the head, every one with 401, none reaching the engine, while a
 * client with the right key beside it is served every time; and the answer to a wrong key is the
 * same whether it is random, differs from a real key in its last character, or was a real key now
 * revoked (nothing in it tells them apart).
 *
 * How fast the flood is refused, how much it slows the right key, and how long each kind of wrong
 * key takes to refuse are figures, not behaviour: `npm run bench:key-flood` (test/perf/key-flood.ts)
 * prints them beside a baseline measured in the same run.
 */
const FLOOD = resolve(import.meta.dir, 'flood.ts')
/** WRONG: how many wrong keys the flood sends (exactly: the test counts every answer). */
const WRONG = 3000
let h: KeysHost
let right = ''

beforeAll(async () => {
  h = await startKeysHost({ logLevel: 'error' })
  right = (await h.createKey({ name: 'right' })).key
})
afterAll(() => h.stop())

/** served: sequential requests with the right key until `until()` (at least `min`); their statuses. */
async function served(until: () => boolean, min: number): Promise<number[]> {
  const out: number[] = []
  while (out.length < min || !until()) {
    const res = await chat(h.url, right)
    await res.arrayBuffer()
    out.push(res.status)
  }
  return out
}

describe('inference keys: wrong keys', () => {
  it('refuses every key of a flood of wrong ones with 401 from the head, and serves the right key beside it', async () => {
    expect(await served(() => true, 5)).toEqual([200, 200, 200, 200, 200])
    const engineBefore = h.tally.requests
    const seenBefore = h.stub.seen.length
    const port = new URL(h.url).port
    // --ms is a deadline for the whole flood (it ends as soon as WRONG are answered), not a pace.
    const flood = Bun.spawn(
      [
        process.execPath,
        FLOOD,
        '--port',
        port,
        '--rate',
        '10000',
        '--ms',
        '30000',
        '--conns',
        '256',
        '--count',
        String(WRONG),
      ],
      { stdout: 'pipe', stderr: 'inherit' },
    )
    let done = false
    void flood.exited.then(() => {
      done = true
    })
    const during = await served(() => done, 20)
    expect(await flood.exited).toBe(0)
    const result = JSON.parse(await new Response(flood.stdout).text()) as {
      sent: number
      refused: number
      other: number
      dropped: number
      ms: number
    }
    console.log(
      `wrong keys: ${result.refused} of ${result.sent} refused with 401 (${result.other} other, ${result.dropped} dropped); ` +
        `right key: ${during.length} requests during the flood`,
    )
    expect(result).toEqual({ sent: WRONG, refused: WRONG, other: 0, dropped: 0, ms: expect.any(Number) })
    expect(during.filter((s) => s !== 200)).toEqual([])
    // Refused from the head: only the right key's requests reached the engine.
    expect(h.stub.seen.length - seenBefore).toBe(during.length)
    expect(h.tally.requests - engineBefore).toBe(during.length)
    // And the right key still works after it.
    expect(await served(() => true, 3)).toEqual([200, 200, 200])
  }, 60_000)

  it('answers a near miss, a revoked key and a random one alike: 401 invalid_api_key, the same body', async () => {
    const k = await h.createKey({ name: 'near' })
    const revoked = await h.createKey({ name: 'gone' })
    expect((await chat(h.url, revoked.key)).status).toBe(200)
    await h.admin('DELETE', `/api/keys/${revoked.id}`)
    const last = k.key.at(-1) === 'A' ? 'B' : 'A'
    const kinds: Record<string, () => string> = {
      random: () => `mg-${randomBytes(32).toString('base64url')}`,
      near: () => k.key.slice(0, -1) + last,
      revoked: () => revoked.key,
    }
    const seenBefore = h.stub.seen.length
    const answers: Record<string, Set<string>> = { random: new Set(), near: new Set(), revoked: new Set() }
    for (let i = 0; i < 20; i++)
      for (const [kind, make] of Object.entries(kinds)) {
        const res = await chat(h.url, make())
        const headers = [...res.headers]
          .filter(([n]) => n !== 'date' && n !== 'x-request-id')
          .map(([n, v]) => `${n}: ${v}`)
          .sort()
        answers[kind]!.add(`${res.status}\n${headers.join('\n')}\n\n${await res.text()}`)
      }
    // One answer per kind, and the same one for all three.
    expect(Object.values(answers).map((s) => s.size)).toEqual([1, 1, 1])
    const [random] = [...answers.random!]
    expect([...answers.near!]).toEqual([random!])
    expect([...answers.revoked!]).toEqual([random!])
    expect(random!.startsWith('401\n')).toBe(true)
    expect(JSON.parse(random!.slice(random!.indexOf('\n\n') + 2))).toEqual({
      error: { message: 'Invalid API key', type: 'authentication_error', code: 'invalid_api_key' },
    })
    // None reached the engine; the near miss's real key is still served.
    expect(h.stub.seen.length).toBe(seenBefore)
    expect((await chat(h.url, k.key)).status).toBe(200)
  }, 30_000)
})
