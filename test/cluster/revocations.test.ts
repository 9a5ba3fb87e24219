import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { type EtcdPods, startEtcdPods } from '../support/cluster.ts'
import { etcdAvailable, startEtcd, type TestEtcd } from '../support/etcd.ts'
import { waitFor } from '../support/wait.ts'

/**
 * A logout holds on every pod: three pods in one test process (real listeners, their own data
 * dirs) led through a real etcd, auth on (simple mode, one JWT_SECRET, so a token from one pod is
 * good on all). A token logged out on one pod is refused by the others within a second (the test
 * waits on each pod's `auth.revoked` event, never on a clock), after a pod restarts on its data dir,
 * and by a pod that was down when the logout happened, once it is back.
 */
const PASSWORD = 'revocations-test-admin-password'
const AUTH = {
  CLUSTER_SECRET: 'cluster-revocations-secret-for-tests-01',
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'jwt-secret-for-the-cluster-revocation-tests-0123456',
}
const IDS = ['p1', 'p2', 'p3'] as const
type PodId = (typeof IDS)[number]

const skip = !etcdAvailable()

describe.skipIf(skip)('logout across the cluster', () => {
  let etcd: TestEtcd
  let cluster: EtcdPods<PodId>

  beforeAll(async () => {
    etcd = await startEtcd()
    cluster = await startEtcdPods({
      ids: IDS,
      etcd,
      clusterId: 'revocations',
      enginePortBase: 23370,
      hostEnv: AUTH,
    })
  }, 90_000)

  afterAll(async () => {
    await cluster?.stop()
    await etcd?.stop()
  }, 60_000)

  const url = (pod: PodId) => cluster.pods[pod].url
  async function login(pod: PodId): Promise<string> {
    const res = await fetch(`${url(pod)}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'admin', password: PASSWORD }),
    })
    expect(res.status).toBe(200)
    return ((await res.json()) as { token: string }).token
  }
  /** me: GET /api/auth/me on `pod` with `token`: its status, and the error message when refused. */
  async function me(pod: PodId, token: string): Promise<{ status: number; message?: string }> {
    const res = await fetch(`${url(pod)}/api/auth/me`, { headers: { authorization: `Bearer ${token}` } })
    const body = (await res.json()) as { error?: { message: string } }
    return { status: res.status, ...(body.error ? { message: body.error.message } : {}) }
  }
  async function logout(pod: PodId, token: string): Promise<void> {
    const res = await fetch(`${url(pod)}/api/auth/logout`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}` },
    })
    expect(res.status).toBe(200)
  }
  /** refusedWithin: `pod` refuses `token` as revoked within `ms`, checked on each of its `auth.revoked` events. */
  const refusedWithin = (pod: PodId, token: string, ms: number) =>
    waitFor(`pod ${pod} to refuse the logged-out token`, async () => (await me(pod, token)).status === 401, {
      timeoutMs: ms,
      wake: (notify) => cluster.pods[pod].host.bus.on('auth.revoked', notify),
    })
  const revoked = { status: 401, message: 'Token has been revoked' }

  it('refuses a token logged out on pod 1 on pods 2 and 3 within a second', async () => {
    const token = await login('p1')
    for (const pod of IDS) expect((await me(pod, token)).status).toBe(200)
    await logout('p1', token)
    const loggedOutAt = performance.now()
    expect(await me('p1', token)).toEqual(revoked)
    await Promise.all([refusedWithin('p2', token, 1000), refusedWithin('p3', token, 1000)])
    console.log(`logout on p1 refused on p2 and p3 after ${(performance.now() - loggedOutAt).toFixed(0)} ms`)
    for (const pod of ['p2', 'p3'] as const) expect(await me(pod, token)).toEqual(revoked)
  })

  it('still refuses it after a pod restarts on its data dir, and a pod that was down learns the logouts it missed', async () => {
    const before = await login('p2')
    await logout('p2', before)
    await refusedWithin('p3', before, 1000)
    await cluster.stopPod('p3')
    // Logged out while p3 is down: p3 was not told.
    const missed = await login('p1')
    await logout('p1', missed)
    const kept = await login('p1')
    await cluster.startPod('p3')
    // Once p3's start has completed, it refuses both: what it kept and what it learnt on rejoining.
    expect(await me('p3', before)).toEqual(revoked)
    expect(await me('p3', missed)).toEqual(revoked)
    expect((await me('p3', kept)).status).toBe(200)
  }, 60_000)
})
