import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { RoutingTable } from '../../plugins/cluster/schemas.ts'
import type { MoveEvent } from '../../plugins/gateway/api.ts'
import { freePort } from '../sim/helpers.ts'
import { etcdAvailable, startEtcd, type TestEtcd } from '../support/etcd.ts'
import { PodProcess } from '../support/pods.ts'
import { readSse } from '../support/sse.ts'
import { chatLoops } from '../support/traffic.ts'
import { waitFor } from '../support/wait.ts'

/**
 * A move across pods whose target POD dies (kill -9 of its modelgate process, as a host crash would)
 * while the target engine is spawning: three `modelgate serve` processes on a real etcd, the model on
 * one pod (the target is never the leader), chats looping through the third pod for the whole test. The move must roll back: the source serves on,
 * every table still sends the model to pod a, and no chat fails.
 */
const SECRET = 'move-kill-cluster-secret-0123456789'
const KEY = 'move-kill-inference-key'
const PASSWORD = 'move-kill-admin-password'
const MODEL = 'mover'
const ENV = {
  CLUSTER_SECRET: SECRET,
  INFERENCE_API_KEY: KEY,
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'jwt-secret-for-the-move-kill-test-0123456789',
}
const IDS = ['a', 'b', 'c'] as const
type PodId = (typeof IDS)[number]

describe.skipIf(!etcdAvailable())('a cross-pod move whose target pod is killed while spawning', () => {
  let etcd: TestEtcd
  let dir: string
  const pods = {} as Record<PodId, PodProcess>
  const tokens = {} as Record<PodId, string>
  let instanceId = ''
  /** S holds the model, T is the move's target (never the leader: killing it must not stop the cluster's lock), E takes the chats. */
  let S: PodId
  let T: PodId
  let E: PodId

  const headers = (id: PodId) => ({
    authorization: `Bearer ${tokens[id]}`,
    'content-type': 'application/json',
  })
  async function get<T>(id: PodId, path: string): Promise<T> {
    const r = await fetch(`${pods[id].url}${path}`, {
      headers: headers(id),
      signal: AbortSignal.timeout(5000),
    })
    if (r.status !== 200) throw new Error(`GET ${path} on ${id}: ${r.status} ${await r.text()}`)
    return (await r.json()) as T
  }
  const routedTo = async (id: PodId) =>
    ((await get<RoutingTable>(id, '/api/cluster/routing-table')).entries[MODEL] ?? []).map((e) => e.podId)

  beforeAll(async () => {
    etcd = await startEtcd()
    dir = mkdtempSync(join(tmpdir(), 'modelgate-move-kill-'))
    const ports = { a: await freePort(), b: await freePort(), c: await freePort() }
    await Promise.all(
      IDS.map(async (id, i) => {
        pods[id] = await PodProcess.start({
          dir,
          id,
          port: ports[id],
          enginePorts: [21500 + i * 10, 21509 + i * 10],
          env: ENV,
          // Pod a holds the model (its engine loads at once); b's and c's take 20 s: time to kill the
          // target's pod while it spawns.
          simEnv: { SIM_LOAD_DELAY_MS: id === 'a' ? '300' : '20000', SIM_TOKENS_PER_SEC: '400' },
          cluster: [
            '    cluster_id: move-kill',
            `    pod_id: ${id}`,
            `    advertise_address: http://127.0.0.1:${ports[id]}`,
            '    expected_size: 3',
            '    coordination:',
            '      kind: etcd',
            `      etcd: { endpoints: ['${etcd.url}'], prefix: /modelgate-move-kill }`,
          ].join('\n'),
        })
        const login = await fetch(`${pods[id].url}/api/auth/login`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ username: 'admin', password: PASSWORD }),
        })
        tokens[id] = ((await login.json()) as { token: string }).token
      }),
    )
    const leader = await waitFor(
      'one leader all three agree on',
      async () => {
        const v = await Promise.all(
          IDS.map((id) => get<{ leaderId: string | null; healthyPodCount: number }>(id, '/api/cluster')),
        )
        const l = v[0]!.leaderId
        return l && v.every((x) => x.leaderId === l && x.healthyPodCount === 3) ? (l as PodId) : undefined
      },
      { timeoutMs: 30_000, pollMs: 100 },
    )
    S = 'a'
    T = leader === 'b' ? 'c' : 'b'
    E = T === 'b' ? 'c' : 'b'
    const load = await fetch(`${pods[S].url}/api/v1/models/load`, {
      method: 'POST',
      headers: headers(S),
      body: JSON.stringify({
        model_path: 'facebook/opt-125m',
        served_model_name: MODEL,
        gpu_ids: [0],
        gpu_memory_utilization: 0.2,
      }),
    })
    expect(load.status).toBe(202)
    instanceId = ((await load.json()) as { instance_id: string }).instance_id
    await waitFor(
      'the model active on its pod and in every table',
      async () => {
        const m = await get<{ model: { status: string } }>(S, `/api/v1/models/${instanceId}`)
        if (m.model.status !== 'active') return false
        const tables = await Promise.all(IDS.map(routedTo))
        return tables.every((t) => JSON.stringify(t) === JSON.stringify([S]))
      },
      { timeoutMs: 30_000, pollMs: 100 },
    )
  }, 90_000)

  afterAll(async () => {
    await Promise.all(IDS.map((id) => pods[id]?.stop()))
    await etcd?.stop()
    if (dir) rmSync(dir, { recursive: true, force: true })
  }, 60_000)

  it('rolls back: the source serves on, every table still points at its pod, no chat through the third pod fails', async () => {
    const traffic = chatLoops(pods[E].url, { key: KEY, model: MODEL, loops: 3 })
    await waitFor('chats to flow through the third pod', () => traffic.ok >= 5, { timeoutMs: 10_000 })
    const move = await fetch(`${pods[E].url}/api/cluster/models/${instanceId}/move`, {
      method: 'POST',
      headers: headers(E),
      body: JSON.stringify({ targetPodId: T, targetGpuIds: [0], drainTimeoutMs: 10_000 }),
    })
    const record = (await move.json()) as { move_id: string }
    expect(move.status).toBe(200)
    const events = await fetch(`${pods[E].url}/api/cluster/moves/${record.move_id}/events`, {
      headers: headers(E),
    })
    let killedAt = 0
    const messages = await readSse<MoveEvent>(
      events,
      'the move to fail after its target pod died',
      (ms) => {
        if (!killedAt && ms.some((m) => m.data.phase === 'spawning')) {
          // kill -9 of the target pod's modelgate (and its engine) while the target spawns.
          pods[T].killNow()
          killedAt = performance.now()
        }
        return ms.some((m) => m.data.phase === 'failed' || m.data.phase === 'completed')
      },
      60_000,
    )
    const phases = messages.map((m) => m.data.phase)
    const last = messages.at(-1)!.data
    console.log(
      `target pod killed in spawning: phases ${[...new Set(phases)].join(' → ')}, rolled back ` +
        `${((performance.now() - killedAt) / 1000).toFixed(1)} s after the kill: ${last.error ?? last.message}`,
    )
    expect(killedAt).toBeGreaterThan(0)
    expect(last.phase).toBe('failed')
    expect(phases).not.toContain('switching')
    expect(last.error).toContain('unreachable')
    expect(last.error).not.toContain('verbose')
    // The source was never touched.
    const m = await get<{ model: { status: string } }>(S, `/api/v1/models/${instanceId}`)
    expect(m.model.status).toBe('active')
    expect(await routedTo(S)).toEqual([S])
    expect(await routedTo(E)).toEqual([S])
    // A few more chats after the rollback, then none may have failed.
    const after = traffic.ok
    await waitFor('chats after the rollback', () => traffic.ok >= after + 5, { timeoutMs: 10_000 })
    const result = await traffic.stop()
    expect(result.failures).toEqual([])
    // Another move is accepted again (the leader's one move lock was released): to the third pod.
    const next = await fetch(`${pods[E].url}/api/cluster/models/${instanceId}/move`, {
      method: 'POST',
      headers: headers(E),
      body: JSON.stringify({ targetPodId: E, targetGpuIds: [1], drainTimeoutMs: 10_000 }),
    })
    expect(next.status, await next.clone().text()).toBe(200)
  }, 120_000)
})
