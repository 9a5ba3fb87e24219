import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { readSse } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Remote lifecycle through the cluster API: two pods in one test process (real listeners, real
 * simulated engines, static coordination, simple-mode auth, the admin JWT of each pod). Everything is
 * asked of pod a and must happen on pod b, over b's signed /internal routes.
 */
const SECRET = 'remote-lifecycle-secret-0123456789'
const JWT = 'j'.repeat(40)

function yaml(id: string, port: number, peers: Record<string, number>): string {
  const list = Object.entries(peers)
    .map(([pod, p]) => `{ pod_id: ${pod}, address: 'http://127.0.0.1:${p}' }`)
    .join(', ')
  return `
  cluster:
    pod_id: ${id}
    advertise_address: http://127.0.0.1:${port}
    expected_size: 2
    request_timeout_ms: 3000
    coordination: { kind: static, static: { leader: a, peers: [${list}] } }`
}

describe('cluster remote lifecycle', () => {
  const pods: Record<string, TestGateway> = {}
  const ports: Record<string, number> = {}
  const tokens: Record<string, string> = {}
  let instance = ''

  async function api<T = Record<string, unknown>>(pod: string, path: string, init: RequestInit = {}) {
    const res = await fetch(`${pods[pod]!.url}${path}`, {
      ...init,
      headers: {
        'content-type': 'application/json',
        authorization: `Bearer ${tokens[pod]}`,
        ...(init.headers ?? {}),
      },
    })
    const text = await res.text()
    return { status: res.status, body: (text ? JSON.parse(text) : null) as T }
  }

  const statusOnB = (want: string) =>
    waitFor(`b's instance ${want}`, async () => {
      const r = await api<{ model: { status: string } }>('b', `/api/v1/models/${instance}`)
      return r.body.model?.status === want
    })

  beforeAll(async () => {
    ports.a = await freePort()
    ports.b = await freePort()
    // Pod c is in the static list but never starts: a pod that is down.
    ports.c = await freePort()
    const starting: [string, readonly [number, number]][] = [
      ['a', [8640, 8649]],
      ['b', [8650, 8659]],
    ]
    for (const [id, range] of starting) {
      pods[id] = await startGateway({
        ports: [range[0], range[1]],
        server: { port: ports[id]! },
        extraYaml: yaml(id, ports[id]!, ports),
        hostEnv: { CLUSTER_SECRET: SECRET, AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw', JWT_SECRET: JWT },
      })
      const login = await fetch(`${pods[id]!.url}/api/auth/login`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ username: 'admin', password: 'pw' }),
      })
      tokens[id] = ((await login.json()) as { token: string }).token
    }
  })

  afterAll(async () => {
    for (const p of Object.values(pods)) await p.stop()
  })

  it("loads a model on pod b through pod a's cluster API, and relays b's events through a", async () => {
    const r = await api<{ instance_id: string; podId: string; status: string }>(
      'a',
      '/api/cluster/models/load',
      {
        method: 'POST',
        body: JSON.stringify({
          modelPath: 'org/remote-model',
          targetPodId: 'b',
          servedModelName: 'remote',
          enableSleepMode: true,
        }),
      },
    )
    expect(r.status).toBe(200)
    expect(r.body).toMatchObject({ podId: 'b', status: 'starting' })
    instance = r.body.instance_id
    const events = await fetch(`${pods.a!.url}/api/cluster/models/${instance}/events?types=status`, {
      headers: { authorization: `Bearer ${tokens.a}` },
    })
    const seen = await readSse<{ status?: string; new_status?: string }>(
      events,
      'an active status relayed from b',
      (m) => m.some((e) => JSON.stringify(e.data).includes('"active"')),
    )
    expect(seen.length).toBeGreaterThan(0)
    // b holds it; a holds nothing.
    const onB = await api<{ models: { id: string; status: string }[] }>('b', '/api/v1/models')
    expect(onB.body.models.map((m) => [m.id, m.status])).toEqual([[instance, 'active']])
    const onA = await api<{ models: unknown[] }>('a', '/api/v1/models')
    expect(onA.body.models).toEqual([])
  })

  it("sleeps, wakes and reads the logs of b's instance through a", async () => {
    const slept = await api<{ podId: string }>('a', `/api/cluster/models/${instance}/sleep`, {
      method: 'POST',
      body: JSON.stringify({ level: 1 }),
    })
    expect(slept.status).toBe(200)
    expect(slept.body.podId).toBe('b')
    await statusOnB('sleeping')
    const woke = await api<{ podId: string }>('a', `/api/cluster/models/${instance}/wake`, {
      method: 'POST',
      body: '{}',
    })
    expect(woke.status).toBe(200)
    await statusOnB('active')
    const logs = await api<{ instance_id: string; line_count: number; podId: string }>(
      'a',
      `/api/cluster/models/${instance}/logs?lines=20`,
    )
    expect(logs.status).toBe(200)
    expect(logs.body).toMatchObject({ instance_id: instance, podId: 'b' })
    expect(logs.body.line_count).toBeGreaterThan(0)
  })

  it("answers b's views through a, and a's own without a hop", async () => {
    const gpus = await api<{ podId: string }>('a', '/api/cluster/pods/b/gpu/available')
    expect(gpus.status).toBe(200)
    expect(gpus.body.podId).toBe('b')
    const info = await api<{ gpus: { processes: unknown[] }[]; podId: string }>(
      'a',
      '/api/cluster/pods/b/gpu/info',
    )
    expect(info.status).toBe(200)
    expect(info.body.gpus.length).toBe(2)
    const full = await api<{ models: { id: string }[]; total: number }>(
      'a',
      '/api/cluster/pods/b/models/full',
    )
    expect(full.body.models.map((m) => m.id)).toEqual([instance])
    const mine = await api<{ total: number; podId: string }>('a', '/api/cluster/pods/a/models/full')
    expect(mine.body).toMatchObject({ total: 0, podId: 'a' })
    const mem = await api('a', '/api/cluster/pods/b/memory')
    expect(mem.status).toBe(200)
  })

  it('answers 404 for an unknown pod or instance', async () => {
    const pod = await api<{ error: { code: string } }>('a', '/api/cluster/pods/zz/gpu/info')
    expect(pod.status).toBe(404)
    expect(pod.body.error.code).toBe('POD_NOT_FOUND')
    const inst = await api<{ error: { code: string } }>('a', '/api/cluster/models/nope/unload', {
      method: 'POST',
    })
    expect(inst.status).toBe(404)
    expect(inst.body.error.code).toBe('INSTANCE_NOT_FOUND')
    const load = await api<{ error: { code: string } }>('a', '/api/cluster/models/load', {
      method: 'POST',
      body: JSON.stringify({ modelPath: 'x', targetPodId: 'zz' }),
    })
    expect(load.status).toBe(404)
  })

  it('refuses an unsigned /internal/models/load from outside, even with the admin JWT, and nothing loads', async () => {
    const r = await fetch(`${pods.b!.url}/internal/models/load`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        authorization: `Bearer ${tokens.b}`,
        'x-cluster-term': '1',
      },
      body: JSON.stringify({ model_path: 'org/intruder' }),
    })
    expect(r.status).toBe(401)
    const onB = await api<{ models: { model_path: string }[] }>('b', '/api/v1/models')
    expect(onB.body.models.map((m) => m.model_path)).toEqual(['org/remote-model'])
  })

  it('unloads through a', async () => {
    const r = await api<{ podId: string; status: string }>('a', `/api/cluster/models/${instance}/unload`, {
      method: 'POST',
    })
    expect(r.body).toMatchObject({ podId: 'b', status: 'stopping' })
    await waitFor(
      'b has no instance left',
      async () => (await api<{ models: unknown[] }>('b', '/api/v1/models')).body.models.length === 0,
    )
  })

  it('loads on b with the engine the body names (engineKind), and refuses one it does not know', async () => {
    const load = (engineKind: string) =>
      api<{ instance_id: string; podId: string; error?: { code: string; message: string } }>(
        'a',
        '/api/cluster/models/load',
        {
          method: 'POST',
          body: JSON.stringify({ modelPath: 'Qwen/Qwen2.5-7B-Instruct', targetPodId: 'b', engineKind }),
        },
      )
    const unknown = await load('llama.cpp')
    expect([unknown.status, unknown.body.error?.code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(unknown.body.error?.message).toContain('engineKind')
    const r = await load('sglang')
    expect(r.status).toBe(200)
    expect(r.body.podId).toBe('b')
    const id = r.body.instance_id
    const onB = await api<{ model: { engine_kind: string; launch_command: string } }>(
      'b',
      `/api/v1/models/${id}`,
    )
    expect(onB.body.model.engine_kind).toBe('sglang')
    expect(onB.body.model.launch_command).toContain(' sim sglang ')
    await api('a', `/api/cluster/models/${id}/unload`, { method: 'POST' })
    await waitFor(
      'b has no instance left',
      async () => (await api<{ models: unknown[] }>('b', '/api/v1/models')).body.models.length === 0,
    )
  })

  it('answers 502 naming a pod that is down (listed, unreachable), within the deadline', async () => {
    const down = await api<{ error: { code: string; message: string } }>('a', '/api/cluster/pods/c/gpu/info')
    expect(down.status).toBe(502)
    expect(down.body.error.code).toBe('PEER_UNREACHABLE')
    expect(down.body.error.message).toContain("'c'")
  })
})
