/**
 * bench:key-budget: how far a key's budget can be overshot across pods, against one pod in the same
 * run. Two pods led through a real etcd, auth on, the vLLM simulator on p1 (p2 serves it in one hop).
 * Each round makes a fresh key with a budget of BUDGET tokens and sends it N non-streamed chats of
 * MAX_TOKENS each, the i-th at i/N of a spread W, alternating between the pods; the baseline round
 * sends the same requests to p1 alone. A pod reserves each request's worst case before it runs
 * (prompt estimate + max_tokens) and learns the other pod's spend every second (SPEND_MS,
 * plugins/cluster/keys.ts), so what both pods together deliver past the budget depends on how much
 * traffic lands within one sync interval: the table prints, per spread, the tokens the clients got
 * (sum of `usage.total_tokens` of every 200), the overshoot past the budget and the requests served.
 *
 *   bun test/perf/key-budget.ts [--rounds 3] [--quick]
 */
import { startEtcdPods } from '../support/cluster.ts'
import { etcdAvailable, startEtcd } from '../support/etcd.ts'
import { waitFor } from '../support/wait.ts'
import { numberArg } from './args.ts'

const QUICK = process.argv.includes('--quick')
const ROUNDS = Math.max(1, numberArg('--rounds', QUICK ? 1 : 3) || 1)
const BUDGET = 1000
const N = 60
const MAX_TOKENS = 100
const SPREADS_MS = QUICK ? [0, 8000] : [0, 2000, 8000, 30_000]
const MODEL = 'budget-bench'
const PASSWORD = 'key-budget-bench-password'
const IDS = ['p1', 'p2'] as const
type PodId = (typeof IDS)[number]

if (!etcdAvailable()) {
  console.error('bench:key-budget needs etcd (Debian: apt-get install etcd-server)')
  process.exit(1)
}

const etcd = await startEtcd()
const cluster = await startEtcdPods({
  ids: IDS,
  etcd,
  clusterId: 'key-budget',
  enginePortBase: 24600,
  hostEnv: {
    CLUSTER_SECRET: 'key-budget-bench-secret-0123456789',
    AUTH_MODE: 'simple',
    ADMIN_PASSWORD: PASSWORD,
    JWT_SECRET: 'jwt-secret-for-the-key-budget-bench-0123456789',
  },
  env: { SIM_TOKENS_PER_SEC: '5000', SIM_TTFT_MS: '5' },
})

const url = (pod: PodId) => cluster.pods[pod].url
async function admin<T>(pod: PodId, method: string, path: string, body?: unknown): Promise<T> {
  const res = await fetch(`${url(pod)}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${cluster.tokens[pod]}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(30_000),
  })
  if (res.status >= 300) throw new Error(`${method} ${path} on ${pod}: ${res.status} ${await res.text()}`)
  return (await res.json()) as T
}

/** chat: one request with `key` through `pod`; the tokens it delivered (0 unless 200). */
async function chat(pod: PodId, key: string, model = MODEL): Promise<{ status: number; tokens: number }> {
  const res = await fetch(`${url(pod)}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({
      model,
      messages: [{ role: 'user', content: 'tell me a long story' }],
      max_tokens: MAX_TOKENS,
      ignore_eos: true,
    }),
    signal: AbortSignal.timeout(60_000),
  })
  const text = await res.text()
  if (res.status !== 200) return { status: res.status, tokens: 0 }
  const usage = (JSON.parse(text) as { usage?: { total_tokens?: number } }).usage
  return { status: 200, tokens: usage?.total_tokens ?? 0 }
}

interface Round {
  delivered: number
  served: number
  refused: number
}

/** round: a fresh key, N requests spread over `spreadMs` to `pods` in turn. */
async function round(pods: readonly PodId[], spreadMs: number): Promise<Round> {
  const made = await admin<{ key: string }>('p1', 'POST', '/api/keys', {
    name: `budget-${crypto.randomUUID().slice(0, 8)}`,
    budget_tokens: BUDGET,
    budget_period: 'day',
  })
  // Every pod knows the key before the round starts (an unknown model: 400/404, not 401).
  for (const pod of pods)
    await waitFor(`${pod} to know the key`, async () => (await chat(pod, made.key, 'nope')).status !== 401, {
      timeoutMs: 10_000,
      pollMs: 20,
    })
  const t0 = performance.now()
  const answers = await Promise.all(
    Array.from({ length: N }, async (_, i) => {
      const at = (i / N) * spreadMs
      const wait = at - (performance.now() - t0)
      if (wait > 0) await Bun.sleep(wait)
      return chat(pods[i % pods.length]!, made.key)
    }),
  )
  const served = answers.filter((a) => a.status === 200)
  return {
    delivered: served.reduce((s, a) => s + a.tokens, 0),
    served: served.length,
    refused: answers.length - served.length,
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.floor(s.length / 2)]!
}

try {
  const load = await admin<{ instance_id: string }>('p1', 'POST', '/api/v1/models/load', {
    model_path: 'org/budget-bench',
    served_model_name: MODEL,
    gpu_ids: [0],
  })
  await waitFor(
    'the model routed from both pods',
    async () => {
      for (const pod of IDS) {
        const t = await admin<{ entries: Record<string, unknown[]> }>(
          pod,
          'GET',
          '/api/cluster/routing-table',
        )
        if (!t.entries[MODEL]?.length) return false
      }
      const m = await admin<{ model: { status: string } }>('p1', 'GET', `/api/v1/models/${load.instance_id}`)
      return m.model.status === 'active'
    },
    { timeoutMs: 60_000 },
  )
  console.log(
    `budget ${BUDGET} tokens, ${N} requests of max_tokens ${MAX_TOKENS} per round (reservation ≈ prompt + ${MAX_TOKENS}), ${ROUNDS} round(s); medians [each round]`,
  )
  console.log('spread ms | pods   | delivered          | overshoot          | served')
  for (const spread of SPREADS_MS) {
    for (const pods of [['p1'], IDS] as const) {
      const rounds: Round[] = []
      for (let r = 0; r < ROUNDS; r++) rounds.push(await round(pods, spread))
      const delivered = rounds.map((x) => x.delivered)
      const over = delivered.map((d) => Math.max(0, d - BUDGET))
      console.log(
        `${String(spread).padStart(9)} | ${(pods.length === 1 ? 'p1' : 'p1+p2').padEnd(6)} | ` +
          `${String(median(delivered)).padStart(5)} [${delivered.join(',')}]`.padEnd(19) +
          ' | ' +
          `${String(median(over)).padStart(5)} [${over.join(',')}]`.padEnd(19) +
          ` | ${median(rounds.map((x) => x.served))}/${N}`,
      )
    }
  }
} finally {
  await cluster.stop()
  await etcd.stop()
}
