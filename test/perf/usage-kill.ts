/**
 * bench:usage-kill: how much inference-key usage a `kill -9` of a pod loses. The usage book
 * (src/http/keys/usage-book.ts) tallies tokens per key in memory and writes them to SQLite at most
 * every FLUSH_MS, so a kill -9 is documented to lose at most the last FLUSH_MS of usage; this
 * measures it. One pod, a `modelgate serve` process of its own (test/support/pods.ts, no cluster, auth
 * on), on a simulated GPU with the vLLM simulator as the engine. Each round:
 *
 * - a fresh key (so its usage is the round's alone) and the model active;
 * - C client loops send non-streamed chats with the key back to back; the client sums every 200
 *   answer's `usage.total_tokens` with the time it completed;
 * - after a random 1.5–3 s the pod is killed with -9 (its engines too), started again on the same
 *   data dir, and the key's usage read from it (GET /api/keys/<id>/usage, prompt + completion tokens);
 * - lost = the client's tokens − the recorded ones, also as milliseconds of the round's traffic
 *   (lost ÷ the client's token rate over the round).
 *
 * A baseline round ends with SIGTERM instead (a clean stop: the loss must be 0). Prints each round,
 * then the median and max over the kill rounds.
 *
 *   bun test/perf/usage-kill.ts [--rounds 5]
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from '../sim/helpers.ts'
import { PodProcess, type PodProcessOptions } from '../support/pods.ts'
import { waitFor } from '../support/wait.ts'
import { numberArg } from './args.ts'

const ROUNDS = Math.max(1, numberArg('--rounds', 5) || 5)
const CLIENTS = 8
const MODEL = 'kill-bench'
const PASSWORD = 'usage-kill-bench-password'
const ENV = {
  AUTH_MODE: 'simple',
  ADMIN_USERNAME: 'admin',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'usage-kill-bench-jwt-secret-0123456789abcdef',
}
const BODY = JSON.stringify({
  model: MODEL,
  messages: [{ role: 'user', content: 'count the tokens' }],
  max_tokens: 16,
  stream: false,
})

interface Round {
  how: 'kill -9' | 'SIGTERM'
  /** Tokens of every 200 answer the client received. */
  client: number
  /** Of those, tokens of answers completed after the signal (read from the socket after it). */
  afterSignal: number
  requests: number
  errors: number
  recorded: number
  /** The client's token rate over the round, tokens per second. */
  rate: number
  /** The round's length: its first request to the signal, ms. */
  durationMs: number
}

async function json<T>(res: Response, what: string, status = 200): Promise<T> {
  if (res.status !== status) throw new Error(`${what}: ${res.status} ${await res.text()}`)
  return (await res.json()) as T
}

/** Admin: an admin session on the pod (simple auth). */
async function login(pod: PodProcess): Promise<string> {
  const res = await fetch(`${pod.url}/api/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'admin', password: PASSWORD }),
  })
  return (await json<{ token: string }>(res, 'login')).token
}

function admin(pod: PodProcess, token: string, method: string, path: string, body?: unknown) {
  return fetch(`${pod.url}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${token}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(5000),
  })
}

interface InstanceView {
  model?: { status: string; served_model_name?: string }
}

/** ensureModel: MODEL active on the pod (loaded now unless the pod brought it back itself). */
async function ensureModel(pod: PodProcess, token: string): Promise<void> {
  const res = await admin(pod, token, 'POST', '/api/v1/models/load', {
    model_path: 'org/kill-bench',
    served_model_name: MODEL,
  })
  if (res.status !== 202) throw new Error(`load: ${res.status} ${await res.text()}`)
  const { instance_id } = (await res.json()) as { instance_id: string }
  await waitFor(
    `${MODEL} active`,
    async () => {
      const r = await admin(pod, token, 'GET', `/api/v1/models/${instance_id}`)
      if (r.status !== 200) return false
      const v = (await r.json()) as InstanceView
      if (v.model?.status === 'failed') throw new Error(`load failed: ${JSON.stringify(v)}`)
      return v.model?.status === 'active'
    },
    { timeoutMs: 60_000, pollMs: 50 },
  )
}

/** recordedTokens: the key's prompt + completion tokens as the pod's usage API has them. */
async function recordedTokens(pod: PodProcess, token: string, keyId: string): Promise<number> {
  const from = new Date(Date.now() - 2 * 3_600_000).toISOString()
  const res = await admin(pod, token, 'GET', `/api/keys/${keyId}/usage?from=${encodeURIComponent(from)}`)
  const answer = await json<{ rows: { prompt_tokens: number; completion_tokens: number }[] }>(res, 'usage')
  return answer.rows.reduce((n, r) => n + r.prompt_tokens + r.completion_tokens, 0)
}

/** traffic: CLIENTS loops of chats with `key` until `stop` is set; each 200's tokens and end time. */
function traffic(pod: PodProcess, key: string, stop: { set: boolean }) {
  const done: { at: number; tokens: number }[] = []
  let errors = 0
  const loop = async () => {
    while (!stop.set) {
      try {
        const res = await fetch(`${pod.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
          body: BODY,
        })
        const text = await res.text()
        const at = performance.now()
        if (res.status !== 200) {
          errors++
          continue
        }
        const tokens = (JSON.parse(text) as { usage?: { total_tokens?: number } }).usage?.total_tokens
        if (typeof tokens !== 'number') throw new Error(`an answer without usage: ${text.slice(0, 300)}`)
        done.push({ at, tokens })
      } catch (err) {
        // After the signal, the pod's sockets close under the requests in flight: expected.
        if (!stop.set) errors++
        if (err instanceof Error && err.message.startsWith('an answer without usage')) throw err
      }
    }
  }
  const started = performance.now()
  const loops = Promise.all(Array.from({ length: CLIENTS }, loop))
  return { done, started, loops, errors: () => errors }
}

async function round(
  pod: PodProcess,
  opts: PodProcessOptions,
  how: Round['how'],
): Promise<{ round: Round; pod: PodProcess }> {
  let token = await login(pod)
  await ensureModel(pod, token)
  const made = await json<{ id: string; key: string }>(
    await admin(pod, token, 'POST', '/api/keys', { name: `kill-bench-${Date.now()}` }),
    'create key',
    201,
  )
  const stop = { set: false }
  const t = traffic(pod, made.key, stop)
  await Bun.sleep(1500 + Math.random() * 1500)
  const signalAt = performance.now()
  stop.set = true
  let stopped: Promise<void>
  if (how === 'kill -9') {
    stopped = pod.kill()
  } else {
    stopped = pod.stop()
  }
  await Promise.all([t.loops, stopped])
  const next = await PodProcess.start(opts)
  token = await login(next)
  const recorded = await recordedTokens(next, token, made.id)
  const client = t.done.reduce((n, d) => n + d.tokens, 0)
  const afterSignal = t.done.filter((d) => d.at > signalAt).reduce((n, d) => n + d.tokens, 0)
  const durationMs = signalAt - t.started
  return {
    pod: next,
    round: {
      how,
      client,
      afterSignal,
      requests: t.done.length,
      errors: t.errors(),
      recorded,
      rate: ((client - afterSignal) / durationMs) * 1000,
      durationMs,
    },
  }
}

function line(i: string, r: Round): string {
  const lost = r.client - r.recorded
  const lostMs = r.rate > 0 ? (lost / r.rate) * 1000 : Number.NaN
  return (
    `${i.padEnd(9)} ${r.how.padEnd(8)} ${(r.durationMs / 1000).toFixed(2).padStart(6)} s ` +
    `${String(r.requests).padStart(6)} req ${String(r.errors).padStart(3)} err ` +
    `${(r.rate / 1000).toFixed(1).padStart(6)} ktok/s | client ${String(r.client).padStart(7)} ` +
    `(after signal ${String(r.afterSignal).padStart(4)}) recorded ${String(r.recorded).padStart(7)} ` +
    `lost ${String(lost).padStart(6)} = ${lostMs.toFixed(0).padStart(5)} ms of traffic`
  )
}

function median(xs: number[]): number {
  const v = [...xs].sort((a, b) => a - b)
  const mid = v.length >> 1
  return v.length % 2 ? v[mid]! : (v[mid - 1]! + v[mid]!) / 2
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-bench-usage-kill-'))
  const opts: PodProcessOptions = {
    dir,
    id: 'solo',
    port: await freePort(),
    enginePorts: [28700, 28709],
    gpus: '1x80',
    logLevel: 'warn',
    env: ENV,
    simEnv: { SIM_LOAD_DELAY_MS: '200', SIM_TOKENS_PER_SEC: '2000', SIM_TTFT_MS: '5' },
  }
  let pod: PodProcess | null = null
  try {
    pod = await PodProcess.start(opts)
    console.log(
      `usage lost to a pod's end: ${CLIENTS} clients, non-streamed chats (max_tokens 16), ` +
        `signal after 1.5–3 s, usage read after a restart on the same data dir\n`,
    )
    const kills: Round[] = []
    for (let i = 0; i < ROUNDS; i++) {
      const r = await round(pod, opts, 'kill -9')
      pod = r.pod
      kills.push(r.round)
      console.log(line(`round ${i + 1}`, r.round))
    }
    const base = await round(pod, opts, 'SIGTERM')
    pod = base.pod
    console.log(line('baseline', base.round))
    const lost = kills.map((r) => r.client - r.recorded)
    const lostMs = kills.map((r) => ((r.client - r.recorded) / r.rate) * 1000)
    console.log(`\nkill -9 over ${kills.length} rounds, median / max:`)
    console.log(`  tokens lost            ${median(lost).toFixed(0)} / ${Math.max(...lost)}`)
    console.log(`  ms of traffic lost     ${median(lostMs).toFixed(0)} / ${Math.max(...lostMs).toFixed(0)}`)
    console.log(
      `  SIGTERM baseline lost  ${base.round.client - base.round.recorded} tokens (FLUSH_MS is 500)`,
    )
  } finally {
    await pod?.stop()
    rmSync(dir, { recursive: true, force: true })
  }
}

await main()
