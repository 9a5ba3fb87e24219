import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { type EtcdPods, startEtcdPods } from '../support/cluster.ts'
import { etcdAvailable, startEtcd, type TestEtcd } from '../support/etcd.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Inference keys across a cluster: three pods in one test process (real listeners, their own data
 * dirs, a simulated engine on p1) led through a real etcd, auth on. A key made, changed or revoked
 * on one pod holds on the others within a second (waited for on each pod's `keys.changed` event, never
 * on a clock); a pod that was down learns what it missed; rate limits hold per pod where requests
 * enter; a budget holds across the pods; usage adds up at GET /api/cluster/usage.
 */
const PASSWORD = 'keys-cluster-test-password'
const AUTH = {
  CLUSTER_SECRET: 'cluster-keys-secret-for-tests-0123456',
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'jwt-secret-for-the-cluster-keys-tests-0123456789',
}
const IDS = ['p1', 'p2', 'p3'] as const
type PodId = (typeof IDS)[number]
const MODEL = 'cluster-keyed'

describe.skipIf(!etcdAvailable())('inference keys across the cluster', () => {
  let etcd: TestEtcd
  let cluster: EtcdPods<PodId>

  beforeAll(async () => {
    etcd = await startEtcd()
    cluster = await startEtcdPods({
      ids: IDS,
      etcd,
      clusterId: 'keys',
      enginePortBase: 24400,
      hostEnv: AUTH,
      env: { SIM_TOKENS_PER_SEC: '2000' },
    })
    const load = await admin('p1', 'POST', '/api/v1/models/load', {
      model_path: 'org/cluster-keyed',
      served_model_name: MODEL,
      gpu_ids: [0],
    })
    expect(load.status).toBe(202)
    // Every pod routes the model (p2 and p3 in one hop to p1).
    await waitFor(
      'every pod routes the model',
      async () => {
        for (const pod of IDS) {
          const r = await admin<{ entries: Record<string, unknown[]> }>(
            pod,
            'GET',
            '/api/cluster/routing-table',
          )
          if (!r.body.entries[MODEL]?.length) return false
        }
        return true
      },
      { timeoutMs: 30_000 },
    )
  }, 120_000)

  afterAll(async () => {
    await cluster?.stop()
    await etcd?.stop()
  }, 60_000)

  const url = (pod: PodId) => cluster.pods[pod].url
  async function admin<T = Record<string, unknown>>(
    pod: PodId,
    method: string,
    path: string,
    body?: unknown,
  ) {
    const res = await fetch(`${url(pod)}${path}`, {
      method,
      headers: {
        authorization: `Bearer ${cluster.tokens[pod]}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    return { status: res.status, body: (await res.json()) as T }
  }
  async function chat(pod: PodId, key: string, model = MODEL, extra: Record<string, unknown> = {}) {
    const res = await fetch(`${url(pod)}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model,
        messages: [{ role: 'user', content: 'hello' }],
        max_tokens: 5,
        ...extra,
      }),
    })
    const text = await res.text()
    return { status: res.status, text, headers: res.headers }
  }
  /** within: `pod` answers `key` with a status other than `not` within `ms`, checked on its `keys.changed` events. */
  const within = (pod: PodId, what: string, check: () => Promise<boolean>, ms = 1000) =>
    waitFor(`pod ${pod}: ${what}`, check, {
      timeoutMs: ms,
      wake: (notify) => cluster.pods[pod].host.bus.on('keys.changed', notify),
    })

  it('a key made on one pod works on the others within a second; a change and a revocation too', async () => {
    const made = await admin<{ id: string; key: string }>('p1', 'POST', '/api/keys', { name: 'everywhere' })
    expect(made.status).toBe(201)
    const { id, key } = made.body
    const t0 = performance.now()
    // An unknown model is refused after the key was accepted (400, not 401): no model needed to tell.
    await Promise.all(
      (['p2', 'p3'] as const).map((pod) =>
        within(pod, 'accept the new key', async () => (await chat(pod, key, 'nope')).status === 400),
      ),
    )
    console.log(`key made on p1 accepted by p2 and p3 after ${(performance.now() - t0).toFixed(0)} ms`)
    await admin('p2', 'PATCH', `/api/keys/${id}`, { models: ['other-model'] })
    await within(
      'p3',
      'refuse the model the key no longer lists',
      async () => (await chat('p3', key)).status === 403,
    )
    expect((await admin<{ models: string[] }>('p1', 'GET', `/api/keys/${id}`)).body.models).toEqual([
      'other-model',
    ])
    const t1 = performance.now()
    expect((await admin('p3', 'DELETE', `/api/keys/${id}`)).status).toBe(200)
    await Promise.all(
      (['p1', 'p2'] as const).map((pod) =>
        within(pod, 'refuse the revoked key', async () => (await chat(pod, key, 'nope')).status === 401),
      ),
    )
    console.log(`key revoked on p3 refused by p1 and p2 after ${(performance.now() - t1).toFixed(0)} ms`)
  })

  it('holds rate limits per pod where requests enter', async () => {
    const { key } = (await admin<{ key: string }>('p1', 'POST', '/api/keys', { name: 'per-pod', rpm: 2 }))
      .body
    await within('p2', 'know the key', async () => (await chat('p2', key, 'nope')).status !== 401)
    // p2 spent one of its two above; p1 has both.
    expect((await chat('p1', key)).status).toBe(200)
    expect((await chat('p1', key)).status).toBe(200)
    expect((await chat('p1', key)).status).toBe(429)
    expect((await chat('p2', key)).status).toBe(200)
    expect((await chat('p2', key)).status).toBe(429)
  })

  it('holds a budget across the pods, and adds up usage at GET /api/cluster/usage', async () => {
    const made = await admin<{ id: string; key: string }>('p1', 'POST', '/api/keys', {
      name: 'shared-budget',
      budget_tokens: 30,
      budget_period: 'day',
    })
    const { id, key } = made.body
    await within('p2', 'know the key', async () => (await chat('p2', key, 'nope')).status !== 401)
    // p1 spends more than the budget (each request: its prompt + 5 tokens); p2 then refuses too.
    for (let i = 0; i < 3; i++) expect((await chat('p1', key)).status).toBe(200)
    expect((await chat('p1', key)).status).toBe(429)
    await waitFor('p2 to refuse the spent budget', async () => (await chat('p2', key)).status === 429, {
      timeoutMs: 5000,
    })
    const r = await chat('p2', key)
    expect(JSON.parse(r.text).error.code).toBe('insufficient_quota')
    // Requests that entered p2 and p3 (the one above on p2 before the budget ran out, and one on p3 hop to p1).
    const other = (await admin<{ key: string; id: string }>('p1', 'POST', '/api/keys', { name: 'usage-sum' }))
      .body
    await within('p3', 'know the key', async () => (await chat('p3', other.key, 'nope')).status !== 401)
    await within('p2', 'know the key', async () => (await chat('p2', other.key, 'nope')).status !== 401)
    expect((await chat('p2', other.key)).status).toBe(200)
    expect((await chat('p3', other.key)).status).toBe(200)
    expect((await chat('p3', other.key, MODEL, { stream: true })).status).toBe(200)
    const usage = await admin<{
      rows: { key_id: string; requests: number; completion_tokens: number; errors: number }[]
      pods: { pod_id: string; ok: boolean }[]
    }>('p1', 'GET', '/api/cluster/usage?group_by=key')
    expect(usage.status).toBe(200)
    expect(usage.body.pods.map((p) => p.ok)).toEqual([true, true, true])
    const mine = usage.body.rows.filter((row) => row.key_id === other.id)
    const sum = mine.reduce(
      (a, row) => ({ requests: a.requests + row.requests, errors: a.errors + row.errors }),
      {
        requests: 0,
        errors: 0,
      },
    )
    // The two unknown-model probes above (on p3 and p2) are errors; three were served.
    expect(sum).toEqual({ requests: 5, errors: 2 })
    expect(mine.reduce((a, row) => a + row.completion_tokens, 0)).toBe(15)
    const budget = usage.body.rows.filter((row) => row.key_id === id)
    expect(budget.reduce((a, row) => a + row.requests, 0)).toBeGreaterThanOrEqual(3)
  })

  it('a pod that was down learns the keys made and revoked meanwhile', async () => {
    const kept = (await admin<{ key: string }>('p1', 'POST', '/api/keys', { name: 'before-down' })).body
    const gone = (
      await admin<{ id: string; key: string }>('p1', 'POST', '/api/keys', { name: 'revoked-while-down' })
    ).body
    await within('p3', 'know both keys', async () => (await chat('p3', gone.key, 'nope')).status !== 401)
    await cluster.stopPod('p3')
    expect((await admin('p1', 'DELETE', `/api/keys/${gone.id}`)).status).toBe(200)
    const made = (await admin<{ key: string }>('p2', 'POST', '/api/keys', { name: 'made-while-down' })).body
    await cluster.startPod('p3')
    // Once p3's start has completed: the revocation and the new key are known.
    expect((await chat('p3', gone.key, 'nope')).status).toBe(401)
    expect((await chat('p3', made.key, 'nope')).status).toBe(400)
    expect((await chat('p3', kept.key, 'nope')).status).toBe(400)
  }, 60_000)
})
