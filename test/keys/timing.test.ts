import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { resolve } from 'node:path'
import { chat, type KeysHost, startKeysHost } from './support.ts'

/**
 * Wrong keys cost the one who sends them: a flood of wrong keys (10,000 a second asked of a
 * separate process, each on its own connection, refused from the head) beside a client with the
 * right key, whose requests all succeed without being slowed past a bound; and the answer to a
 * wrong key takes as long whether it is random, differs from a real key in its last character, or
 * was a real key now revoked (a lookup by a keyed hash: nothing to learn per key).
 */
const FLOOD = resolve(import.meta.dir, 'flood.ts')
let h: KeysHost
let right = ''

beforeAll(async () => {
  h = await startKeysHost({ logLevel: 'error' })
  right = (await h.createKey({ name: 'right' })).key
})
afterAll(() => h.stop())

const median = (xs: number[]) => {
  const v = [...xs].sort((a, b) => a - b)
  return v[Math.floor(v.length / 2)]!
}

/** timed: `n` sequential requests with the right key; their latencies (ms); every one must be 200. */
async function timed(until: () => boolean, min: number): Promise<number[]> {
  const out: number[] = []
  while (out.length < min || !until()) {
    const t = performance.now()
    const res = await chat(h.url, right)
    await res.arrayBuffer()
    out.push(performance.now() - t)
    expect(res.status).toBe(200)
  }
  return out
}

describe('inference keys: wrong keys', () => {
  it('a flood of wrong keys does not slow the right ones', async () => {
    await timed(() => true, 50) // warm-up
    const base = median(await timed(() => true, 300))
    const port = new URL(h.url).port
    const flood = Bun.spawn(
      [process.execPath, FLOOD, '--port', port, '--rate', '10000', '--ms', '3000', '--conns', '256'],
      {
        stdout: 'pipe',
        stderr: 'inherit',
      },
    )
    let done = false
    void flood.exited.then(() => {
      done = true
    })
    const during = await timed(() => done, 100)
    const result = JSON.parse(await new Response(flood.stdout).text()) as {
      sent: number
      refused: number
      other: number
      ms: number
    }
    const rate = (result.refused * 1000) / result.ms
    const p50 = median(during)
    console.log(
      `wrong keys refused: ${Math.round(rate)}/s (${result.refused} of ${result.sent}, ${result.other} other); ` +
        `right key p50 ${base.toFixed(2)} ms alone, ${p50.toFixed(2)} ms during the flood (${during.length} requests)`,
    )
    expect(result.other).toBe(0)
    expect(rate).toBeGreaterThan(2000)
    expect(p50).toBeLessThan(2 * base + 2)
  }, 30_000)

  it('takes as long to refuse a near miss or a revoked key as a random one', async () => {
    const k = await h.createKey({ name: 'near' })
    const revoked = await h.createKey({ name: 'gone' })
    await h.admin('DELETE', `/api/keys/${revoked.id}`)
    const last = k.key.at(-1) === 'A' ? 'B' : 'A'
    const kinds: Record<string, () => string> = {
      random: () => `mg-${randomBytes(32).toString('base64url')}`,
      near: () => k.key.slice(0, -1) + last,
      revoked: () => revoked.key,
    }
    const times: Record<string, number[]> = { random: [], near: [], revoked: [] }
    for (let i = 0; i < 300; i++)
      for (const [kind, make] of Object.entries(kinds)) {
        const t = performance.now()
        const res = await chat(h.url, make())
        await res.arrayBuffer()
        times[kind]!.push(performance.now() - t)
        expect(res.status).toBe(401)
      }
    const m = Object.fromEntries(Object.entries(times).map(([kind, xs]) => [kind, median(xs)]))
    console.log(`401 median ms: ${JSON.stringify(m)}`)
    const bound = Math.max(0.1, 0.2 * m.random!)
    expect(Math.abs(m.near! - m.random!)).toBeLessThan(bound)
    expect(Math.abs(m.revoked! - m.random!)).toBeLessThan(bound)
  }, 30_000)
})
