import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { BenchmarkRun } from '../../plugins/benchmarks/schemas.ts'
import { addressedTo, CLUSTER_HEADERS, signRequest } from '../../plugins/cluster/signing.ts'
import type { MemoryProfile } from '../../plugins/gateway/api.ts'
import { type EtcdPods, startEtcdPods } from '../support/cluster.ts'
import { etcdAvailable, startEtcd, type TestEtcd } from '../support/etcd.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Profiles and benchmarks kept one across the fleet: three pods in one test process (real listeners,
 * real simulated engines, each with its own data dir and simulated GPUs) led through a real etcd,
 * auth on (simple mode, a read-only user too), the benchmarks plugin on each; and a fresh single-pod
 * modelgate that takes a cluster's benchmark export.
 */
const SECRET = 'cluster-fleet-secret-for-tests-0123'
const PASSWORD = 'fleet-test-admin-password'
const AUTH = {
  CLUSTER_SECRET: SECRET,
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'jwt-secret-for-the-cluster-fleet-tests-0123456789',
}
const IDS = ['a', 'b', 'c'] as const
type PodId = (typeof IDS)[number]
const H100 = 'NVIDIA H100 80GB HBM3'

const skip = !etcdAvailable()

describe.skipIf(skip)('profiles and benchmarks across the fleet', () => {
  let etcd: TestEtcd
  const pods = {} as Record<PodId, TestGateway>
  const tokens = {} as Record<PodId, string>
  let readonlyToken = ''
  let single: TestGateway | undefined
  let singleToken = ''

  async function login(gw: TestGateway, username: string, password: string): Promise<string> {
    const r = await gw.json<{ token: string }>('/api/auth/login', {
      method: 'POST',
      body: JSON.stringify({ username, password }),
    })
    expect(r.status).toBe(200)
    return r.body.token
  }
  function as<T = Record<string, unknown>>(
    gw: TestGateway,
    token: string,
    path: string,
    init: RequestInit = {},
  ) {
    return gw.json<T>(path, {
      ...init,
      headers: { authorization: `Bearer ${token}`, ...(init.headers ?? {}) },
    })
  }
  const admin = <T = Record<string, unknown>>(pod: PodId, path: string, init: RequestInit = {}) =>
    as<T>(pods[pod], tokens[pod], path, init)
  const post = <T = Record<string, unknown>>(pod: PodId, path: string, body?: unknown) =>
    admin<T>(pod, path, { method: 'POST', ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
  const profilesOn = async (pod: PodId) =>
    (await admin<{ profiles: MemoryProfile[] }>(pod, '/api/memory/profiles')).body.profiles
  const manual = (pod: PodId, over: Record<string, unknown>) =>
    post<{ profile: MemoryProfile }>(pod, '/api/memory/profiles', {
      profileName: 'typed in',
      modelPath: 'acme/fleet-model',
      maxTokens: 4096,
      totalGpuMemoryGib: 30,
      weightsMemoryGib: 10,
      cudaGraphsGib: 1,
      gpuName: H100,
      gpuTotalMemoryGib: 79.65,
      ...over,
    })
  const sorted = (ps: MemoryProfile[]) => [...ps].sort((x, y) => (x.id < y.id ? -1 : 1))

  let cluster: EtcdPods<PodId>
  beforeAll(async () => {
    etcd = await startEtcd()
    cluster = await startEtcdPods({
      ids: IDS,
      etcd,
      clusterId: 'fleet',
      enginePortBase: 21000,
      hostEnv: AUTH,
      env: { SIM_TOKENS_PER_SEC: '400', SIM_TTFT_MS: '5' },
      extraYaml: '  benchmarks: {}\n',
      sessionTtlSeconds: 3,
    })
    Object.assign(pods, cluster.pods)
    Object.assign(tokens, cluster.tokens)
    readonlyToken = (await pods.c.host.auth.issueToken('viewer', ['admin-readonly'])).token
  }, 90_000)

  afterAll(async () => {
    await Promise.all([cluster?.stop(), single?.stop()])
    await etcd?.stop()
  }, 60_000)

  it('reconciles profiles recorded on different pods: all three end identical, the newest of a duplicate kept', async () => {
    const onlyA = (await manual('a', { profileName: 'only on a', modelPath: 'acme/only-a' })).body.profile
    const olderDup = (await manual('a', { profileName: 'older duplicate', totalGpuMemoryGib: 31 })).body
      .profile
    // The same key (model, max tokens, GPU, TP) recorded later on pod b: the newer one.
    await waitFor('a later timestamp', () => Date.now() > Date.parse(olderDup.created_at) + 5, { pollMs: 2 })
    const newerDup = (await manual('b', { profileName: 'newer duplicate', totalGpuMemoryGib: 33 })).body
      .profile
    const onlyB = (await manual('b', { profileName: 'only on b', modelPath: 'acme/only-b' })).body.profile
    expect(Date.parse(newerDup.created_at)).toBeGreaterThan(Date.parse(olderDup.created_at))
    expect((await profilesOn('c')).length).toBe(0)

    const r = await post<{ profiles: number; complete: boolean; pods: { podId: string; ok: boolean }[] }>(
      'c',
      '/api/cluster/memory-profiles/reconcile',
    )
    expect(r.status).toBe(200)
    expect(r.body.profiles).toBe(3)
    expect(r.body.complete).toBe(true)
    expect(r.body.pods.map((p) => [p.podId, p.ok]).sort()).toEqual([
      ['a', true],
      ['b', true],
      ['c', true],
    ])
    const lists = await Promise.all(IDS.map(profilesOn))
    const want = sorted([onlyA, newerDup, onlyB]).map((p) => p.id)
    for (const l of lists) expect(sorted(l).map((p) => p.id)).toEqual(want)
    expect(JSON.stringify(sorted(lists[0]!))).toBe(JSON.stringify(sorted(lists[1]!)))
    expect(JSON.stringify(sorted(lists[1]!))).toBe(JSON.stringify(sorted(lists[2]!)))
    // The older duplicate is gone from pod a, where it was recorded.
    expect(lists[0]!.some((p) => p.id === olderDup.id)).toBe(false)
    // A second reconcile changes nothing.
    const again = await post<{ pods: { imported: number }[] }>('a', '/api/cluster/memory-profiles/reconcile')
    expect(again.body.pods.every((p) => p.imported === 0)).toBe(true)
  })

  it('exports the union as one single-pod bundle and imports a bundle on every pod', async () => {
    const bundle = await admin<{ format: string; version: number; profiles: MemoryProfile[] }>(
      'b',
      '/api/cluster/memory-profiles/export',
    )
    expect(bundle.status).toBe(200)
    expect(bundle.body.format).toBe('modelgate.memory-profiles')
    expect(bundle.body.version).toBe(1)
    expect(bundle.body.profiles.length).toBe(3)
    // A bundle made elsewhere (one new profile) imported through pod a reaches every pod.
    const fresh = {
      ...bundle.body.profiles[0]!,
      id: 'imported-profile-1',
      model_path: 'acme/imported',
      created_at: new Date().toISOString(),
    }
    const r = await post<{ complete: boolean; pods: { imported: number }[] }>(
      'a',
      '/api/cluster/memory-profiles/import',
      { ...bundle.body, profiles: [fresh] },
    )
    expect(r.status).toBe(200)
    expect(r.body.complete).toBe(true)
    expect(r.body.pods.map((p) => p.imported)).toEqual([1, 1, 1])
    for (const id of IDS) expect((await profilesOn(id)).some((p) => p.id === fresh.id)).toBe(true)
  })

  it('exports a benchmark run from pod b through pod a; a fresh single pod imports it, once', async () => {
    const load = await post<{ instance_id: string }>('b', '/api/v1/models/load', {
      model_path: 'facebook/opt-125m',
      gpu_memory_utilization: 0.3,
    })
    expect(load.status).toBe(202)
    const instanceId = load.body.instance_id
    await waitFor(
      'the model active on pod b',
      async () =>
        (await admin<{ model: { status: string } }>('b', `/api/v1/models/${instanceId}`)).body.model
          ?.status === 'active',
      { timeoutMs: 30_000, wake: (notify) => pods.b.host.bus.on('gateway.instance.status', notify) },
    )
    const created = await post<{ benchmark: BenchmarkRun }>('b', '/api/benchmarks', {
      name: 'fleet run',
      mode: 'isolated',
      scenarios: [
        {
          instanceId,
          routingMode: 'direct',
          inputTokens: 16,
          outputTokens: 8,
          concurrency: 2,
          warmupRequests: 0,
          totalRequests: 4,
          slaThresholdMs: 5000,
        },
      ],
    })
    expect(created.status).toBe(201)
    const runId = created.body.benchmark.id
    const run = await waitFor(
      'the run to finish on pod b',
      async () => {
        const r = (await admin<{ benchmark: BenchmarkRun }>('b', `/api/benchmarks/${runId}`)).body.benchmark
        return ['completed', 'failed', 'cancelled'].includes(r.status) ? r : undefined
      },
      { timeoutMs: 30_000, wake: (notify) => pods.b.host.bus.on('benchmarks.event', notify) },
    )
    expect(run.status).toBe('completed')

    const exported = await admin<{ format: string; runs: BenchmarkRun[] }>(
      'a',
      '/api/cluster/benchmarks/export',
    )
    expect(exported.status).toBe(200)
    expect(exported.body.format).toBe('modelgate.benchmarks')
    expect(exported.body.runs.map((r) => r.id)).toEqual([runId])
    const metrics = exported.body.runs[0]!.scenarios[0]!.metrics!
    expect(metrics.successful_requests).toBe(4)

    single = await startGateway({
      ports: [21090, 21099],
      hostEnv: { AUTH_MODE: 'simple', ADMIN_PASSWORD: PASSWORD, JWT_SECRET: AUTH.JWT_SECRET },
      extraYaml: '  benchmarks: {}\n',
    })
    singleToken = await login(single, 'admin', PASSWORD)
    const into = (body: unknown) =>
      as<{ imported: number; skipped: number }>(single!, singleToken, '/api/benchmarks/import', {
        method: 'POST',
        body: JSON.stringify(body),
      })
    const first = await into(exported.body)
    expect(first.status).toBe(200)
    expect(first.body.imported).toBe(1)
    const there = await as<{ benchmark: BenchmarkRun }>(single, singleToken, `/api/benchmarks/${runId}`)
    expect(there.status).toBe(200)
    expect(there.body.benchmark.scenarios[0]!.metrics!.successful_requests).toBe(4)
    const second = await into(exported.body)
    expect(second.body).toMatchObject({ imported: 0, skipped: 1 })

    // Into the cluster through pod c: the run exists on pod b, so it is skipped.
    const viaC = await post<{
      imported: number
      skipped: number
      skipped_runs: { id: string; reason: string }[]
    }>('c', '/api/cluster/benchmarks/import', exported.body)
    expect(viaC.status).toBe(200)
    expect(viaC.body.imported).toBe(0)
    expect(viaC.body.skipped_runs).toEqual([{ id: runId, reason: 'already exists on pod b' }])
    expect((await admin('c', `/api/benchmarks/${runId}`)).status).toBe(404)
  }, 90_000)

  it('refuses hostile bundles with 4xx in the controller shape, and changes nothing', async () => {
    const before = (await profilesOn('a')).length
    const raw = (body: string) =>
      fetch(`${pods.a.url}/api/cluster/memory-profiles/import`, {
        method: 'POST',
        headers: { authorization: `Bearer ${tokens.a}`, 'content-type': 'application/json' },
        body,
      })
    const malformed = await raw('{"format": "modelgate.memory-profiles", "version": 1, ')
    expect(malformed.status).toBe(400)
    expect(((await malformed.json()) as { error: { code: string } }).error.code).toBeString()
    const wrongFormat = await post('a', '/api/cluster/memory-profiles/import', {
      format: 'something-else',
      version: 1,
      exported_at: '',
      profiles: [],
    })
    expect(wrongFormat.status).toBe(400)
    const newer = await post<{ error: { code: string } }>('a', '/api/cluster/memory-profiles/import', {
      format: 'modelgate.memory-profiles',
      version: 99,
      exported_at: '',
      profiles: [],
    })
    expect(newer.status).toBe(400)
    expect(newer.body.error.code).toBe('UNSUPPORTED_BUNDLE_VERSION')
    const deep = await raw(`${'['.repeat(5000)}${']'.repeat(5000)}`)
    expect(deep.status).toBe(400)
    const huge = await raw(
      JSON.stringify({ format: 'modelgate.memory-profiles', version: 1, pad: 'x'.repeat(17 * 1024 * 1024) }),
    )
    expect(huge.status).toBe(413)
    const benchWrong = await post('c', '/api/cluster/benchmarks/import', { format: 'modelgate.benchmarks' })
    expect(benchWrong.status).toBe(400)
    expect((await profilesOn('a')).length).toBe(before)
  })

  it('asks for a token, refuses the read-only role on the writes (not the reads), and refuses unsigned or replayed internal calls', async () => {
    const anon = await fetch(`${pods.a.url}/api/cluster/memory-profiles/export`)
    expect(anon.status).toBe(401)
    for (const path of ['/api/cluster/memory-profiles/reconcile', '/api/cluster/benchmarks/import']) {
      const r = await as(pods.c, readonlyToken, path, { method: 'POST', body: '{}' })
      expect(r.status).toBe(403)
    }
    expect((await as(pods.c, readonlyToken, '/api/cluster/memory-profiles/export')).status).toBe(200)
    expect((await as(pods.c, readonlyToken, '/api/cluster/benchmarks/export')).status).toBe(200)

    const path = addressedTo('/internal/memory-profiles', 'b')
    const body = Buffer.from(JSON.stringify({ profiles: [] }))
    const unsigned = await fetch(`${pods.b.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${tokens.b}` },
      body,
    })
    expect(unsigned.status).toBe(401)
    const term = (await admin<{ term: number }>('b', '/api/cluster')).body.term
    // The same signed request twice: the first is obeyed, the second refused as a replay.
    const ts = Date.now()
    const headers = {
      'content-type': 'application/json',
      [CLUSTER_HEADERS.term]: String(term),
      [CLUSTER_HEADERS.signature]: signRequest(SECRET, 'POST', path, ts, body),
      [CLUSTER_HEADERS.timestamp]: String(ts),
      [CLUSTER_HEADERS.pod]: 'a',
    }
    const once = await fetch(`${pods.b.url}${path}`, { method: 'POST', headers, body })
    expect(once.status, await once.clone().text()).toBe(200)
    const replay = await fetch(`${pods.b.url}${path}`, { method: 'POST', headers, body })
    expect(replay.status).toBe(401)
  })
})
