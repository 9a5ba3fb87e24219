import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Two pods in one test process (real listeners, real simulated engines), `static` coordination:
 * pod a leads (term 1). They hear each other by heartbeat, the leader builds the routing table and
 * the follower adopts it, and a load on the follower reaches the table at once (model-loaded event,
 * well before the next heartbeat).
 */
const SECRET = 'cluster-secret-for-tests-0123456789'

function clusterYaml(id: string, port: number, peers: Record<string, number>, heartbeatMs: number): string {
  const list = Object.entries(peers)
    .map(([pod, p]) => `{ pod_id: ${pod}, address: 'http://127.0.0.1:${p}' }`)
    .join(', ')
  return `
  cluster:
    pod_id: ${id}
    advertise_address: http://127.0.0.1:${port}
    expected_size: 2
    heartbeat_interval_ms: ${heartbeatMs}
    coordination:
      kind: static
      static: { leader: a, peers: [${list}] }`
}

describe('cluster membership (static coordination)', () => {
  const pods: Record<string, TestGateway> = {}
  const ports: Record<string, number> = {}

  beforeAll(async () => {
    ports.a = await freePort()
    ports.b = await freePort()
    // A long heartbeat interval: what the test sees before it comes from events, not from polling.
    for (const [id, range] of [
      ['a', [8610, 8619]],
      ['b', [8620, 8629]],
    ] as const) {
      pods[id] = await startGateway({
        ports: [range[0], range[1]],
        extraYaml: clusterYaml(id, ports[id]!, ports, 60_000),
        hostEnv: { CLUSTER_SECRET: SECRET },
        server: { port: ports[id]! },
      })
    }
  })

  afterAll(async () => {
    for (const p of Object.values(pods)) await p.stop()
  })

  it('refuses to start without a cluster secret of 16 characters', async () => {
    const port = await freePort()
    await expect(
      startGateway({
        ports: [8630, 8639],
        extraYaml: clusterYaml('c', port, { c: port }, 5000),
        hostEnv: { CLUSTER_SECRET: 'short' },
      }),
    ).rejects.toThrow(/auth\.cluster_secret/)
  })

  it('has one leader both pods agree on, under term 1', async () => {
    for (const id of ['a', 'b']) {
      const s = await pods[id]!.json<Record<string, unknown>>('/api/cluster')
      expect(s.status).toBe(200)
      expect(s.body).toMatchObject({
        leaderId: 'a',
        term: 1,
        isLeader: id === 'a',
        localPodId: id,
        coordination: 'static',
      })
    }
  })

  it('sees both pods healthy once they have heard each other', async () => {
    for (const id of ['a', 'b']) {
      await waitFor(`pod ${id} sees two healthy pods`, async () => {
        const s = await pods[id]!.json<{ healthyPodCount: number; health: string }>('/api/cluster')
        return s.body.healthyPodCount === 2 && s.body.health === 'healthy'
      })
    }
    const { body } = await pods.b!.json<{ pods: { podId: string; role: string }[] }>('/api/cluster/pods')
    expect(body.pods.map((p) => [p.podId, p.role])).toEqual([
      ['a', 'leader'],
      ['b', 'follower'],
    ])
  })

  it("puts a model loaded on the follower into both pods' routing tables", async () => {
    const id = await pods.b!.load({ model_path: 'org/tiny-model', served_model_name: 'tiny' })
    await pods.b!.waitStatus(id, 'active')
    const tables = async () =>
      Promise.all(
        ['a', 'b'].map((p) =>
          pods[p]!.json<{ version: number; entries: Record<string, unknown[]> }>(
            '/api/cluster/routing-table',
          ),
        ),
      )
    await waitFor('both tables list tiny on pod b', async () => {
      const [a, b] = await tables()
      return JSON.stringify(a!.body) === JSON.stringify(b!.body) && (a!.body.entries.tiny?.length ?? 0) === 1
    })
    const [a] = await tables()
    expect(a!.body.entries.tiny).toEqual([
      { podId: 'b', podAddress: `http://127.0.0.1:${ports.b}`, vllmPort: expect.any(Number), weight: 1 },
    ])
    const models = await pods.a!.json<{ models: { instanceId: string; status: string }[] }>(
      '/api/cluster/pods/b/models',
    )
    expect(models.body.models).toEqual([expect.objectContaining({ instanceId: id, status: 'running' })])
  })

  it('answers 404 for a pod it does not know', async () => {
    const r = await pods.a!.json<{ error: { code: string } }>('/api/cluster/pods/nope/models')
    expect(r.status).toBe(404)
    expect(r.body.error.code).toBe('POD_NOT_FOUND')
  })

  it('refuses an unsigned internal call from outside, whatever else it carries', async () => {
    const r = await fetch(`${pods.a!.url}/internal/state`, { headers: { 'x-cluster-term': '1' } })
    expect(r.status).toBe(401)
  })
  it('drops a pod that leaves (pod-left) from the pods and the routing table at once', async () => {
    const b = pods.b!
    delete pods.b
    await b.stop()
    const { body } = await pods.a!.json<{ pods: { podId: string }[] }>('/api/cluster/pods')
    expect(body.pods.map((p) => p.podId)).toEqual(['a'])
    const table = await pods.a!.json<{ entries: Record<string, unknown[]> }>('/api/cluster/routing-table')
    expect(table.body.entries).toEqual({})
    const status = await pods.a!.json<{ health: string; podCount: number }>('/api/cluster')
    expect(status.body).toMatchObject({ podCount: 1, health: 'degraded' })
  })
})
