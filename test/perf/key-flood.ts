/**
 * bench:key-flood: what a flood of wrong inference keys costs, and whether refusing a wrong key
 * takes longer for some keys than others. These were assertions in test/keys/timing.test.ts (the
 * flood refused at > 2,000/s, the right key's p50 under twice its own, the kinds of wrong key within
 * 20 % of each other), which failed on a busy machine; the test now asserts what is refused and
 * served, and the figures are here, each beside a baseline from the same run:
 *
 * - the right key's latency, p50 over sequential requests: alone (baseline), then during a flood of
 *   wrong keys from a separate process (test/keys/flood.ts: a new connection per key, `--rate` per
 *   second for `--ms`); the flood's refusals per second;
 * - the time to answer 401 for a random key (baseline), a near miss (a real key with its last
 *   character changed) and a revoked key, interleaved, medians.
 *
 * The host is the one the keys tests use (test/keys/support.ts: the proxy host with auth on, a stub
 * engine), in this process; the flood runs in its own.
 *
 *   bun test/perf/key-flood.ts [--rounds 3] [--rate 10000] [--ms 3000]
 */
import { randomBytes } from 'node:crypto'
import { resolve } from 'node:path'
import { chat, startKeysHost } from '../keys/support.ts'
import { numberArg } from './args.ts'

const ROUNDS = Math.max(1, numberArg('--rounds', 3) || 3)
const RATE = numberArg('--rate', 10_000) || 10_000
const MS = numberArg('--ms', 3000) || 3000
const FLOOD = resolve(import.meta.dir, '../keys/flood.ts')

const median = (xs: number[]) => {
  const v = [...xs].sort((a, b) => a - b)
  return v[Math.floor(v.length / 2)] ?? Number.NaN
}

const h = await startKeysHost({ logLevel: 'error' })
try {
  const right = (await h.createKey({ name: 'right' })).key

  /** timed: sequential right-key requests until `until()` (at least `min`); their latencies, ms. */
  const timed = async (until: () => boolean, min: number): Promise<number[]> => {
    const out: number[] = []
    while (out.length < min || !until()) {
      const t = performance.now()
      const res = await chat(h.url, right)
      await res.arrayBuffer()
      out.push(performance.now() - t)
      if (res.status !== 200) throw new Error(`right key answered ${res.status}`)
    }
    return out
  }

  /** flood: the flood process at `port`; whether it ended, and its JSON line. */
  const flood = (port: string) => {
    const p = Bun.spawn(
      [process.execPath, FLOOD, '--port', port, '--rate', String(RATE), '--ms', String(MS), '--conns', '256'],
      { stdout: 'pipe', stderr: 'inherit' },
    )
    let done = false
    void p.exited.then(() => {
      done = true
    })
    const result = new Response(p.stdout)
      .text()
      .then(
        (t) => JSON.parse(t) as { sent: number; refused: number; other: number; dropped: number; ms: number },
      )
    return { done: () => done, result }
  }
  const bare = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    fetch: () => Response.json({ error: { code: 'invalid_api_key' } }, { status: 401 }),
  })

  await timed(() => true, 50) // warm-up
  console.log(`flood: ${RATE}/s asked for ${MS} ms, 256 connections at most; ${ROUNDS} round(s)`)
  console.log(
    'round | right key p50: alone (baseline), during the flood, ratio | refused/s: bare Bun.serve 401 (baseline), modelgate (of sent), ratio',
  )
  const ratios: number[] = []
  const rates: number[] = []
  const rateRatios: number[] = []
  for (let r = 1; r <= ROUNDS; r++) {
    const base = median(await timed(() => true, 300))
    const b = await flood(String(bare.port)).result
    const bareRate = (b.refused * 1000) / b.ms
    const fl = flood(new URL(h.url).port)
    const during = await timed(fl.done, 100)
    const f = await fl.result
    const rate = (f.refused * 1000) / f.ms
    const p50 = median(during)
    ratios.push(p50 / base)
    rates.push(rate)
    rateRatios.push(rate / bareRate)
    console.log(
      `${String(r).padStart(5)} | ${base.toFixed(2)} ms, ${p50.toFixed(2)} ms, ${(p50 / base).toFixed(2)} | ` +
        `${Math.round(bareRate)}/s, ${Math.round(rate)}/s (${f.refused} of ${f.sent}, ${f.other} other, ${f.dropped} dropped), ${(rate / bareRate).toFixed(2)}`,
    )
  }
  console.log(
    `median over rounds: right key during the flood / alone ${median(ratios).toFixed(2)}; ` +
      `refused ${Math.round(median(rates))}/s, ${median(rateRatios).toFixed(2)} of the bare listener's`,
  )
  bare.stop(true)

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
  for (let i = 0; i < 300 * ROUNDS; i++)
    for (const [kind, make] of Object.entries(kinds)) {
      const t = performance.now()
      const res = await chat(h.url, make())
      await res.arrayBuffer()
      times[kind]!.push(performance.now() - t)
      if (res.status !== 401) throw new Error(`${kind} key answered ${res.status}`)
    }
  const m = Object.fromEntries(Object.entries(times).map(([kind, xs]) => [kind, median(xs)]))
  console.log(`\n401, median of ${300 * ROUNDS} each, interleaved:`)
  console.log(`  random key (baseline)  ${m.random!.toFixed(3)} ms`)
  for (const kind of ['near', 'revoked'])
    console.log(
      `  ${(kind === 'near' ? 'near miss' : 'revoked key').padEnd(22)} ${m[kind]!.toFixed(3)} ms  ` +
        `(${(m[kind]! - m.random!).toFixed(3)} ms, ×${(m[kind]! / m.random!).toFixed(2)} of the baseline)`,
    )
} finally {
  await h.stop()
}
