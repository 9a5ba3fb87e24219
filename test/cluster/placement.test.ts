import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { ApplyResult } from '../../plugins/cluster/placement/service.ts'
import { type EtcdPods, signedFetch, startEtcdPods } from '../support/cluster.ts'
import { etcdAvailable, startEtcd, type TestEtcd } from '../support/etcd.ts'
import type { TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * A preset applied to the whole cluster: three pods in one test process (real listeners, real
 * simulated engines, two simulated 80 GB GPUs each) led through a real etcd, auth on. The preset is
 * the leader's; the test finds the leader (L) and the two followers (F1, F2) by asking the cluster.
 */
const SECRET = 'cluster-placement-secret-for-tests-01'
const PASSWORD = 'placement-test-admin-password'
const AUTH = {
  CLUSTER_SECRET: SECRET,
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'jwt-secret-for-the-cluster-placement-tests-012345',
}
const IDS = ['a', 'b', 'c'] as const
type PodId = (typeof IDS)[number]
const OPT = 'facebook/opt-125m'

type Model = { id: string; status: string; served_model_name: string; gpu_ids: number[]; engine_kind: string }

const skip = !etcdAvailable()

describe.skipIf(skip)('a preset applied to the cluster', () => {
  let etcd: TestEtcd
  const pods = {} as Record<PodId, TestGateway>
  const tokens = {} as Record<PodId, string>
  let L: PodId
  let F1: PodId
  let F2: PodId
  let term = 0

  const admin = <T = Record<string, unknown>>(pod: PodId, path: string, init: RequestInit = {}) =>
    pods[pod].json<T>(path, {
      ...init,
      headers: { authorization: `Bearer ${tokens[pod]}`, ...(init.headers ?? {}) },
    })
  const post = <T = Record<string, unknown>>(pod: PodId, path: string, body?: unknown) =>
    admin<T>(pod, path, { method: 'POST', ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
  const models = async (pod: PodId) => (await admin<{ models: Model[] }>(pod, '/api/v1/models')).body.models
  /** where: every pod's models as "pod:served:status:gpus", sorted. */
  const where = async () =>
    (
      await Promise.all(
        IDS.map(async (id) =>
          (await models(id)).map((m) => `${id}:${m.served_model_name}:${m.status}:${m.gpu_ids}`),
        ),
      )
    )
      .flat()
      .sort()
  const apply = (pod: PodId, presetId: string, body: unknown) =>
    post<ApplyResult & { error?: { code: string; message: string } }>(
      pod,
      `/api/cluster/presets/${presetId}/apply`,
      body,
    )

  async function loadOn(pod: PodId, served: string, gpu: number): Promise<string> {
    const r = await post<{ instance_id: string }>(L, '/api/cluster/models/load', {
      modelPath: OPT,
      servedModelName: served,
      targetPodId: pod,
      gpuIds: [gpu],
      gpuMemoryUtilization: 0.3,
    })
    expect(r.status).toBe(200)
    return r.body.instance_id
  }
  const allActive = (want: string[]) =>
    waitFor(
      `exactly ${want.join(', ')} active`,
      async () => {
        const all = (await Promise.all(IDS.map(models))).flat()
        const names = all.map((m) => `${m.served_model_name}:${m.status}`).sort()
        return JSON.stringify(names) === JSON.stringify(want.map((w) => `${w}:active`).sort())
          ? all
          : undefined
      },
      { timeoutMs: 60_000, pollMs: 100 },
    )

  /** signedSync: POST /internal/presets/sync to `pod` as the leader would, with `withTerm`. */
  const signedSync = (pod: PodId, presets: unknown[], withTerm: number) =>
    signedFetch(
      pods[pod].url,
      SECRET,
      'POST',
      '/internal/presets/sync',
      { presets },
      { from: L, to: pod, term: withTerm },
    )

  let cluster: EtcdPods<PodId>
  beforeAll(async () => {
    etcd = await startEtcd()
    cluster = await startEtcdPods({
      ids: IDS,
      etcd,
      clusterId: 'placement',
      enginePortBase: 21100,
      hostEnv: AUTH,
      env: { SIM_LOAD_DELAY_MS: '200' },
    })
    Object.assign(pods, cluster.pods)
    Object.assign(tokens, cluster.tokens)
    L = cluster.leader
    term = cluster.term
    ;[F1, F2] = IDS.filter((id) => id !== L) as [PodId, PodId]
  }, 90_000)

  afterAll(async () => {
    await cluster?.stop()
    await etcd?.stop()
  }, 60_000)

  it('syncs a preset saved on the leader to every pod', async () => {
    await loadOn(L, 'beta', 0)
    await allActive(['beta'])
    const saved = await post<{ configuration: { id: string } }>(L, '/api/configurations', {
      name: 'saved on leader',
    })
    expect(saved.status).toBe(201)
    const id = saved.body.configuration.id
    for (const f of [F1, F2])
      await waitFor(
        `pod ${f} to hold the leader's preset`,
        async () =>
          (await admin<{ configuration: { name: string } }>(f, `/api/configurations/${id}`)).status === 200,
        { timeoutMs: 15_000, pollMs: 50 },
      )
    const copy = await admin<{ configuration: { name: string; entries: { servedModelName: string }[] } }>(
      F1,
      `/api/configurations/${id}`,
    )
    expect(copy.body.configuration.name).toBe('saved on leader')
    expect(copy.body.configuration.entries.map((e) => e.servedModelName)).toEqual(['beta'])
  })

  const PRESET = {
    id: 'preset-apply-me',
    name: 'apply me',
    description: 'three that fit, one that cannot',
    modelCount: 4,
    createdAt: '2026-11-24T00:00:00.000Z',
    updatedAt: '2026-11-24T00:00:00.000Z',
    entries: [
      ['alpha', [], 1, 0],
      ['gamma', [], 1, 1],
      ['delta', [1], 1, 2],
      ['huge', [], 4, 3],
    ].map(([name, gpuIds, tp, order]) => ({
      id: `entry-${name}`,
      modelPath: OPT,
      servedModelName: name,
      maxTokens: null,
      sourceType: 'huggingface',
      gpuIds,
      tensorParallelSize: tp,
      extraArgs: [],
      loadOrder: order,
      enableSleepMode: false,
      gpuMemoryUtilization: 0.3,
      // One entry names its engine; the others come as a leader that does not send one would send them.
      ...(name === 'delta' ? { engineKind: 'sglang' } : {}),
    })),
  }

  it('plans with dryRun: the same answer twice, nothing changed; a follower refuses to apply', async () => {
    // The preset reaches the leader as a sync would bring it (the leader's own store).
    const synced = await signedSync(L, [PRESET], term)
    expect(synced.status).toBe(200)
    expect(await synced.json()).toEqual({ created: 1, updated: 0, unchanged: 0, conflicts: [] })
    await loadOn(F1, 'alpha', 0)
    await loadOn(F2, 'extra', 0)
    await allActive(['alpha', 'beta', 'extra'])
    const before = await where()

    const one = await apply(L, PRESET.id, { dryRun: true })
    expect(one.status).toBe(200)
    const two = await apply(L, PRESET.id, { dryRun: true })
    expect(two.body).toEqual(one.body)
    expect(await where()).toEqual(before)
    expect(one.body.dryRun).toBe(true)
    expect(one.body.presetName).toBe('apply me')
    expect(one.body.placed.map((p) => [p.servedModelName, p.status])).toEqual([
      ['alpha', 'kept'],
      ['gamma', 'planned'],
      ['delta', 'planned'],
    ])
    expect(one.body.placed[0]!.podId).toBe(F1)
    expect(one.body.unplaceable).toEqual([
      {
        modelPath: OPT,
        servedModelName: 'huge',
        reason: expect.stringContaining('needs 4 GPU(s) on one pod with 23.9 GiB free each'),
      },
    ])
    expect(one.body.unloaded.map((u) => [u.podId, u.reason]).sort()).toEqual(
      [
        [L, "not in preset 'apply me'"],
        [F2, "not in preset 'apply me'"],
      ].sort(),
    )

    const refused = await apply(F1, PRESET.id, { dryRun: true })
    expect(refused.status).toBe(409)
    expect(refused.body.error!.code).toBe('NOT_LEADER')
    expect(refused.body.error!.message).toContain(`pod ${L}`)
  })

  it('applies for real: every entry that fits runs where the answer says, the rest is unloaded', async () => {
    const r = await apply(L, PRESET.id, {})
    expect(r.status).toBe(200)
    expect(r.body.dryRun).toBe(false)
    expect(r.body.unplaceable.map((u) => u.servedModelName)).toEqual(['huge'])
    const placed = r.body.placed
    expect(placed.map((p) => p.servedModelName)).toEqual(['alpha', 'gamma', 'delta'])
    const all = await allActive(['alpha', 'gamma', 'delta'])
    const now = await where()
    for (const p of placed) {
      expect(now).toContain(`${p.podId}:${p.servedModelName}:active:${p.gpuIds}`)
      if (p.instanceId) expect(all.some((m) => m.id === p.instanceId)).toBe(true)
    }
    // delta kept the GPU the preset names, and runs the engine it names; the others the pods' default.
    expect(placed.find((p) => p.servedModelName === 'delta')!.gpuIds).toEqual([1])
    expect(all.map((m) => `${m.served_model_name}:${m.engine_kind}`).sort()).toEqual([
      'alpha:vllm',
      'delta:sglang',
      'gamma:vllm',
    ])
    // Applying again changes nothing: everything is kept.
    const again = await apply(L, PRESET.id, { dryRun: true })
    expect(again.body.placed.map((p) => p.status)).toEqual(['kept', 'kept', 'kept'])
    expect(again.body.unloaded).toEqual([])
  }, 90_000)

  it('refuses bad requests: unknown preset, a non-boolean dryRun, no token, the read-only role, a stale term', async () => {
    expect((await apply(L, 'no-such-preset', { dryRun: true })).status).toBe(404)
    expect((await apply(L, PRESET.id, { dryRun: 'yes' })).status).toBe(400)
    const anon = await fetch(`${pods[L].url}/api/cluster/presets/${PRESET.id}/apply`, { method: 'POST' })
    expect(anon.status).toBe(401)
    const viewer = (await pods[L].host.auth.issueToken('viewer', ['admin-readonly'])).token
    const ro = await pods[L].json(`/api/cluster/presets/${PRESET.id}/apply`, {
      method: 'POST',
      headers: { authorization: `Bearer ${viewer}` },
      body: JSON.stringify({ dryRun: true }),
    })
    expect(ro.status).toBe(403)
    const stale = await signedSync(
      F1,
      [{ ...PRESET, name: 'stale', updatedAt: new Date().toISOString() }],
      term - 1,
    )
    expect(stale.status).toBe(409)
    expect(((await stale.json()) as { error: { code: string } }).error.code).toBe('STALE_TERM')
  })
})
