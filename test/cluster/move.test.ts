import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { ClusterMoveRecord } from '../../plugins/cluster/move/schemas.ts'
import type { RoutingTable } from '../../plugins/cluster/schemas.ts'
import type { MoveEvent } from '../../plugins/gateway/api.ts'
import { freePort, signalGroup } from '../sim/helpers.ts'
import { etcdAvailable, startEtcd, type TestEtcd } from '../support/etcd.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { readSse } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Moves across pods: three pods in one test process (real listeners, real simulated engines, each
 * with its own simulated GPUs) led through a real etcd (whichever pod wins leads), admin auth, an inference
 * key and a cluster secret. Model `moving` starts on pod a; 20 streams loop through pod c's /v1 (and
 * 4 through pod a's, one of the two pods it moves between) for the whole file, each failure kept
 * with its answer. Every move is asked of pod c, followed on pod c, and cancelled through pod c,
 * while it runs on the pod that holds the model.
 */
const SECRET = 'cluster-move-secret-for-tests-0123'
const KEY = 'inference-key-for-move-tests'
const PASSWORD = 'move-test-admin-password'
const AUTH = {
  CLUSTER_SECRET: SECRET,
  INFERENCE_API_KEY: KEY,
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'jwt-secret-for-the-cluster-move-tests-0123456789',
}
const IDS = ['a', 'b', 'c'] as const
type PodId = (typeof IDS)[number]
const MODEL = 'moving'

function clusterYaml(id: string, ports: Record<string, number>, etcdUrl: string): string {
  // A long heartbeat: tables reach the pods by events (a move waits on them), not by the clock.
  return `
  cluster:
    cluster_id: move
    pod_id: ${id}
    advertise_address: http://127.0.0.1:${ports[id]}
    expected_size: 3
    heartbeat_interval_ms: 60000
    coordination:
      kind: etcd
      etcd: { endpoints: ['${etcdUrl}'], prefix: /modelgate-move-test }`
}

const pods = {} as Record<PodId, TestGateway>
const ports = {} as Record<PodId, number>
const tokens = {} as Record<PodId, string>
/** Where `moving` is now. */
const where = { pod: 'a' as PodId, id: '' }
let traffic: Traffic

async function admin<T = Record<string, unknown>>(pod: PodId, path: string, init: RequestInit = {}) {
  return pods[pod].json<T>(path, { ...init, headers: { authorization: `Bearer ${tokens[pod]}` } })
}

type Model = { id: string; status: string; gpu_ids: number[]; served_model_name: string }
async function modelsOn(pod: PodId): Promise<Model[]> {
  const r = await admin<{ models: Model[] }>(pod, '/api/v1/models')
  return r.body.models.filter((m) => m.served_model_name === MODEL)
}

/** routedTo: the pods each pod's routing table sends `moving` to. */
async function routedTo(): Promise<Record<PodId, string[]>> {
  const out = {} as Record<PodId, string[]>
  for (const id of IDS) {
    const t = (await admin<RoutingTable>(id, '/api/cluster/routing-table')).body
    out[id] = (t.entries[MODEL] ?? []).map((e) => e.podId)
  }
  return out
}

const everywhere = (pod: PodId) => ({ a: [pod], b: [pod], c: [pod] })

/** follow reads the move's events from pod c until it has completed or failed, stamping each on arrival. */
async function follow(moveId: string): Promise<{ events: MoveEvent[]; at: number[] }> {
  const res = await fetch(`${pods.c.url}/api/cluster/moves/${moveId}/events`, {
    headers: { authorization: `Bearer ${tokens.c}` },
  })
  const at: number[] = []
  const messages = await readSse<MoveEvent>(
    res,
    `move ${moveId} to complete or fail`,
    (ms) => {
      while (at.length < ms.length) at.push(performance.now())
      return ms.some((m) => m.data.phase === 'completed' || m.data.phase === 'failed')
    },
    45_000,
  )
  for (const m of messages) expect(m.event).toBe('move_progress')
  return { events: messages.map((m) => m.data), at }
}

function startMove(to: PodId, gpu: number, drainTimeoutMs = 20_000) {
  return admin<ClusterMoveRecord & { error?: { code: string; message: string } }>(
    'c',
    `/api/cluster/models/${where.id}/move`,
    {
      method: 'POST',
      body: JSON.stringify({ targetPodId: to, targetGpuIds: [gpu], drainTimeoutMs }),
    },
  )
}

const other = (p: PodId): PodId => (p === 'a' ? 'b' : 'a')

/** waitForPhase: the move reached `phase` on the pod that runs it (its bus). */
function waitForPhase(pod: PodId, moveId: string, phase: string) {
  let seen = false
  const off = pods[pod].host.bus.on('cluster.move.progress', (e) => {
    if (e.move_id === moveId && e.phase === phase) seen = true
  })
  return waitFor(`move ${moveId} to reach ${phase}`, () => seen, {
    timeoutMs: 20_000,
    wake: (notify) => pods[pod].host.bus.on('cluster.move.progress', notify),
  }).finally(off)
}

/** moved: `moving` is on `pod` alone now, and every table routes it there. */
async function moved(pod: PodId): Promise<void> {
  const on = await modelsOn(pod)
  expect(on).toHaveLength(1)
  expect(on[0]!.status).toBe('active')
  expect(await modelsOn(other(pod))).toEqual([])
  expect(await routedTo()).toEqual(everywhere(pod))
  where.pod = pod
  where.id = on[0]!.id
}

interface Answer {
  ok: boolean
  status: number
  via: string
  error?: string
}

/**
 * Traffic: streaming chats in a loop, one worker per base URL, each answer kept (a failure with its
 * status and the start of its body). A request fails when it is not a 200 event stream ending in
 * `data: [DONE]` with every token it asked for.
 */
class Traffic {
  readonly answers: Answer[] = []
  private readonly listeners = new Set<() => void>()
  private stopped = false
  private readonly workers: Promise<void>[]

  constructor(
    private readonly model: string,
    private readonly key: string,
    urls: string[],
  ) {
    this.workers = urls.map((u) => this.loop(u))
  }

  private async loop(url: string): Promise<void> {
    while (!this.stopped) {
      let answer: Answer
      try {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${this.key}` },
          body: JSON.stringify({
            model: this.model,
            messages: [{ role: 'user', content: 'keep counting' }],
            max_tokens: 12,
            ignore_eos: true,
            stream: true,
          }),
        })
        const text = await res.text()
        const chunks = text.split('\n\n').filter((f) => f.startsWith('data: {') && f.includes('"content"'))
        const ok = res.status === 200 && text.endsWith('data: [DONE]\n\n') && chunks.length >= 12
        answer = { ok, status: res.status, via: url, ...(ok ? {} : { error: text.slice(0, 300) }) }
      } catch (err) {
        answer = { ok: false, status: 0, via: url, error: String(err) }
      }
      this.answers.push(answer)
      for (const f of this.listeners) f()
    }
  }

  mark(): number {
    return this.answers.length
  }

  failuresSince(mark: number): Answer[] {
    return this.answers.slice(mark).filter((a) => !a.ok)
  }

  okSince(mark: number): number {
    return this.answers.slice(mark).filter((a) => a.ok).length
  }

  /** answersSince waits until `n` answers came after `mark`. */
  answersSince(mark: number, n: number): Promise<unknown> {
    return waitFor(`${n} answers`, () => this.answers.length >= mark + n, {
      timeoutMs: 20_000,
      wake: (notify) => {
        this.listeners.add(notify)
        return () => this.listeners.delete(notify)
      },
    })
  }

  /** started: every worker has had an answer. */
  started(): Promise<unknown> {
    return this.answersSince(0, this.workers.length)
  }

  async stop(): Promise<void> {
    this.stopped = true
    await Promise.all(this.workers)
  }
}

describe.skipIf(!etcdAvailable())('cluster move across pods', () => {
  let etcd: TestEtcd
  beforeAll(async () => {
    etcd = await startEtcd()
    for (const id of IDS) ports[id] = await freePort()
    for (const [i, id] of IDS.entries()) {
      pods[id] = await startGateway({
        ports: [8730 + i * 10, 8739 + i * 10],
        extraYaml: clusterYaml(id, ports, etcd.url),
        hostEnv: AUTH,
        server: { port: ports[id] },
        env: { SIM_LOAD_DELAY_MS: '800', SIM_TOKENS_PER_SEC: '200' },
      })
      const login = await pods[id].json<{ token: string }>('/api/auth/login', {
        method: 'POST',
        body: JSON.stringify({ username: 'admin', password: PASSWORD }),
      })
      tokens[id] = login.body.token
    }
    const r = await admin<{ instance_id: string }>('a', '/api/v1/models/load', {
      method: 'POST',
      body: JSON.stringify({
        model_path: 'facebook/opt-125m',
        served_model_name: MODEL,
        gpu_ids: [0],
        gpu_memory_utilization: 0.2,
        enable_sleep_mode: true,
        extra_args: ['--enforce-eager'],
      }),
    })
    expect(r.status).toBe(202)
    where.id = r.body.instance_id
    await waitFor(
      'moving active on pod a',
      async () => (await modelsOn('a')).some((m) => m.id === where.id && m.status === 'active'),
      { timeoutMs: 30_000, wake: (notify) => pods.a.host.bus.on('gateway.instance.status', notify) },
    )
    await waitFor(
      'every pod to route moving to pod a',
      async () => JSON.stringify(await routedTo()) === JSON.stringify(everywhere('a')),
    )
    traffic = new Traffic(MODEL, KEY, [
      ...Array.from({ length: 20 }, () => pods.c.url),
      ...Array.from({ length: 4 }, () => pods.a.url),
    ])
    await traffic.started()
  }, 120_000)

  afterAll(async () => {
    await traffic?.stop()
    for (const id of IDS) await pods[id]?.stop()
    await etcd?.stop()
  })

  it('moves the model from pod a to pod b under traffic with no failed request, every table pointing at b', async () => {
    const mark = traffic.mark()
    const res = await startMove('b', 1, 10_000)
    expect(res.status).toBe(200)
    expect(res.body).toMatchObject({
      instance_id: where.id,
      podId: 'a',
      targetPodId: 'b',
      target_gpu_ids: [1],
    })
    const started = performance.now()
    const { events, at } = await follow(res.body.move_id)
    const phases = [...new Set(events.map((e) => e.phase))]
    expect(phases.slice(-4)).toEqual(['switching', 'draining', 'completing', 'completed'])
    expect(phases).toContain('spawning')
    const progress = events.filter((e) => e.phase === 'spawning').map((e) => e.progress!)
    expect(progress.at(-1)).toBe(100)
    expect([...progress].sort((x, y) => x - y)).toEqual(progress)
    printTimings('a → b', events, at, started)

    // Every pod's table points at b alone, at once: the move waited for each of them.
    expect(await routedTo()).toEqual(everywhere('b'))
    expect(await modelsOn('a')).toEqual([])
    const onB = await modelsOn('b')
    expect(onB).toHaveLength(1)
    expect(onB[0]).toMatchObject({ status: 'active', gpu_ids: [1] })
    where.pod = 'b'
    where.id = onB[0]!.id
    await traffic.answersSince(traffic.mark(), 24)
    expect(traffic.failuresSince(mark)).toEqual([])
    expect(traffic.okSince(mark)).toBeGreaterThan(24)
  }, 60_000)

  it('refuses a second move anywhere in the cluster while one runs (409), single-pod moves included', async () => {
    const loaded = await admin<{ instance_id: string }>('c', '/api/v1/models/load', {
      method: 'POST',
      body: JSON.stringify({
        model_path: 'facebook/opt-125m',
        served_model_name: 'bystander',
        gpu_memory_utilization: 0.2,
        gpu_ids: [0],
      }),
    })
    expect(loaded.status).toBe(202)
    const bystander = loaded.body.instance_id
    await waitFor(
      'bystander active on pod c',
      async () =>
        (await admin<{ model: { status: string } }>('c', `/api/v1/models/${bystander}`)).body.model
          ?.status === 'active',
      { timeoutMs: 30_000, wake: (notify) => pods.c.host.bus.on('gateway.instance.status', notify) },
    )
    const mark = traffic.mark()
    const first = await startMove(other(where.pod), 0)
    expect(first.status).toBe(200)
    await waitForPhase(where.pod, first.body.move_id, 'spawning')
    for (const [pod, body] of [
      ['a', { targetPodId: 'b', targetGpuIds: [1] }],
      ['b', { targetGpuIds: [1] }],
    ] as const) {
      const second = await admin<{ error: { code: string } }>(pod, `/api/cluster/models/${bystander}/move`, {
        method: 'POST',
        body: JSON.stringify(body),
      })
      expect(second.status).toBe(409)
      expect(second.body.error.code).toBe('MOVE_IN_PROGRESS')
    }
    // The move of the model itself is refused by its own pod: its source is busy.
    const same = await startMove(other(where.pod), 1)
    expect(same.status).toBe(409)
    const { events } = await follow(first.body.move_id)
    expect(events.at(-1)!.phase).toBe('completed')
    await moved(other(where.pod))
    expect(traffic.failuresSince(mark)).toEqual([])
    // Once it is over, the next move may go: a single-pod move through the cluster API, on pod c.
    const next = await admin<ClusterMoveRecord>('a', `/api/cluster/models/${bystander}/move`, {
      method: 'POST',
      body: JSON.stringify({ targetGpuIds: [1] }),
    })
    expect(next.status).toBe(200)
    expect(next.body).toMatchObject({ podId: 'c', targetPodId: 'c', target_gpu_ids: [1] })
    expect((await follow(next.body.move_id)).events.at(-1)!.phase).toBe('completed')
    const gone = await admin('c', `/api/v1/models/${bystander}`)
    expect(gone.status).toBe(404)
    for (const m of (await admin<{ models: Model[] }>('c', '/api/v1/models')).body.models)
      await admin('c', `/api/v1/models/${m.id}/unload`, { method: 'POST' })
  }, 60_000)

  /**
   * cancelAt starts a move of `moving` to the other pod and, at the first event of `phase` on the pod
   * that runs it, sends the cancel through pod c. `holdSource` keeps a long chat open on the source
   * (sent to its own pod before the move), so draining lasts until it ends.
   */
  async function cancelAt(phase: string, force: boolean, holdSource = false) {
    const source = { ...where }
    const target = other(source.pod)
    const held = holdSource ? await longChat(source.pod) : null
    let loads = 0
    const offLoads = pods[target].host.bus.on('gateway.instance.status', (e) => {
      if (e.currentStatus === 'starting' && e.instance.served_model_name === MODEL) loads++
    })
    let cancel: Promise<{ status: number; body: { error?: { code: string } } | null }> | null = null
    const off = pods[source.pod].host.bus.on('cluster.move.progress', (e) => {
      if (e.phase !== phase || cancel) return
      cancel = admin('c', `/api/cluster/moves/${e.move_id}?force=${force}`, { method: 'DELETE' })
    })
    const mark = traffic.mark()
    const res = await startMove(target, 1)
    expect(res.status).toBe(200)
    const { events } = await follow(res.body.move_id)
    off()
    offLoads()
    expect(cancel).not.toBeNull()
    const answer = await cancel!
    const heldOk = held ? await held.done : null
    return {
      source,
      target,
      answer,
      events,
      phases: events.map((e) => e.phase),
      final: events.at(-1)!,
      mark,
      loads,
      heldOk,
    }
  }

  /** longChat: a 600-token stream to the source pod's own /v1 (3 s), open once its head has arrived. */
  async function longChat(pod: PodId): Promise<{ done: Promise<boolean> }> {
    const res = await fetch(`${pods[pod].url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({
        model: MODEL,
        messages: [{ role: 'user', content: 'long' }],
        max_tokens: 600,
        ignore_eos: true,
        stream: true,
      }),
    })
    expect(res.status).toBe(200)
    // Wrapped: an async function returning the bare promise would wait for the whole answer.
    return {
      done: res.text().then(
        (t) => t.endsWith('data: [DONE]\n\n'),
        () => false,
      ),
    }
  }

  async function stays(r: { source: { pod: PodId; id: string }; target: PodId; mark: number }) {
    const on = await modelsOn(r.source.pod)
    expect(on.map((m) => [m.id, m.status])).toEqual([[r.source.id, 'active']])
    expect(await modelsOn(r.target)).toEqual([])
    expect(await routedTo()).toEqual(everywhere(r.source.pod))
    await traffic.answersSince(traffic.mark(), 24)
  }

  it('cancel in validating aborts at once: nothing loads, the source serves on', async () => {
    const r = await cancelAt('validating', false)
    expect(r.answer.status).toBe(204)
    expect(r.final).toMatchObject({ phase: 'failed', error: 'cancelled' })
    expect(r.loads).toBe(0)
    await stays(r)
    expect(traffic.failuresSince(r.mark)).toEqual([])
  }, 60_000)

  for (const force of [false, true]) {
    it(`cancel in spawning kills the target and keeps the source (force=${force})`, async () => {
      const r = await cancelAt('spawning', force)
      expect(r.answer.status).toBe(204)
      expect(r.final).toMatchObject({ phase: 'failed', error: 'cancelled' })
      expect(r.phases).not.toContain('switching')
      expect(r.loads).toBe(1)
      await stays(r)
      expect(traffic.failuresSince(r.mark)).toEqual([])
    }, 60_000)
  }

  for (const phase of ['switching', 'draining']) {
    it(`cancel in ${phase} without force puts the source back in every table and unloads the target`, async () => {
      const r = await cancelAt(phase, false, phase === 'draining')
      expect(r.answer.status).toBe(204)
      expect(r.final).toMatchObject({ phase: 'failed', error: 'cancelled' })
      if (phase === 'switching') expect(r.phases).not.toContain('draining')
      else {
        // The chat held open on the source finished there, after the move was called off.
        expect(r.phases.slice(-2)).toEqual(['draining', 'failed'])
        expect(r.heldOk).toBe(true)
      }
      await stays(r)
      expect(traffic.failuresSince(r.mark)).toEqual([])
    }, 60_000)

    it(`cancel in ${phase} with force completes at once and unloads the source`, async () => {
      const r = await cancelAt(phase, true, phase === 'draining')
      expect(r.answer.status).toBe(204)
      expect(r.final.phase).toBe('completed')
      if (phase === 'switching') expect(r.phases).not.toContain('draining')
      else expect(r.phases.slice(-3)).toEqual(['draining', 'completing', 'completed'])
      await moved(r.target)
      // Force may drop the source's open connections (the spec says so): counted, not forbidden.
      const cut = traffic.failuresSince(r.mark)
      // Failing, it shows the answers that were not 200 (their status and the start of their body).
      expect(cut.filter((a) => a.status !== 200)).toEqual([])
      console.log(`cancel(force) in ${phase}: ${cut.length} stream(s) cut short`)
    }, 60_000)
  }

  it('refuses a cancel when completing (too late), and once completed or unknown', async () => {
    const r = await cancelAt('completing', false)
    expect(r.answer.status).toBe(409)
    expect(r.answer.body?.error?.code).toBe('MOVE_NOT_CANCELLABLE')
    expect(r.final.phase).toBe('completed')
    await moved(r.target)
    expect(traffic.failuresSince(r.mark)).toEqual([])
    const again = await admin<{ error: { code: string } }>('c', `/api/cluster/moves/${r.final.move_id}`, {
      method: 'DELETE',
    })
    expect(again.status).toBe(409)
    expect(again.body.error.code).toBe('MOVE_NOT_CANCELLABLE')
    expect((await admin('b', '/api/cluster/moves/mv-unknown', { method: 'DELETE' })).status).toBe(404)
    expect((await admin('b', '/api/cluster/moves/mv-unknown/events')).status).toBe(404)
    // Its record, from a pod that did not run it.
    const record = await admin<ClusterMoveRecord>('b', `/api/cluster/moves/${r.final.move_id}`)
    expect(record.body).toMatchObject({ phase: 'completed', podId: r.source.pod, targetPodId: r.target })
  }, 60_000)

  it('rolls back when the target engine dies while it loads: the source serves on, no request fails', async () => {
    const mark = traffic.mark()
    const source = { ...where }
    const target = other(source.pod)
    let killed: number | null = null
    const off = pods[target].host.bus.on('gateway.instance.status', (e) => {
      if (e.currentStatus !== 'starting' || e.instance.served_model_name !== MODEL || killed) return
      killed = e.instance.process_id
      if (killed) signalGroup(killed, 'SIGKILL')
    })
    const res = await startMove(target, 1)
    expect(res.status).toBe(200)
    const started = performance.now()
    const { events, at } = await follow(res.body.move_id)
    off()
    printTimings(`${source.pod} → ${target} (target engine killed)`, events, at, started)
    expect(killed).not.toBeNull()
    const final = events.at(-1)!
    expect(final.phase).toBe('failed')
    expect(final.error).toContain('target failed to start')
    expect(events.map((e) => e.phase)).not.toContain('switching')
    expect(await modelsOn(target)).toEqual([])
    const still = await modelsOn(source.pod)
    expect(still.map((m) => [m.id, m.status])).toEqual([[source.id, 'active']])
    expect(await routedTo()).toEqual(everywhere(source.pod))
    await traffic.answersSince(traffic.mark(), 24)
    expect(traffic.failuresSince(mark)).toEqual([])
  }, 60_000)
})

/** printTimings: when each phase began, relative to the start call's answer, and how long it lasted. */
function printTimings(label: string, events: MoveEvent[], at: number[], started: number): void {
  const first = new Map<string, number>()
  events.forEach((e, i) => {
    if (!first.has(e.phase)) first.set(e.phase, at[i]!)
  })
  const list = [...first.entries()]
  const lines = list.map(([phase, t], i) => {
    const next = list[i + 1]?.[1]
    const lasted = next === undefined ? '' : ` lasted ${(next - t).toFixed(0)} ms`
    return `  ${phase.padEnd(11)} at +${(t - started).toFixed(0).padStart(5)} ms${lasted}`
  })
  console.log(`move ${label} phases (seen on pod c):\n${lines.join('\n')}`)
}
