import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import Anthropic from '@anthropic-ai/sdk'
import { PeerClient, PeerError } from '../../plugins/cluster/peer-client.ts'
import type { InternalState, RoutingEntry, RoutingTable } from '../../plugins/cluster/schemas.ts'
import { signRequest } from '../../plugins/cluster/signing.ts'
import { Logger } from '../../src/host/logger.ts'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { parse, rawExchange } from '../support/raw-client.ts'
import { type RawHttpServer, rawHttpServer } from '../support/raw-http.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Inference from any pod: three pods in one test process (real listeners, real simulated engines),
 * `static` coordination with pod c leading, admin auth (simple mode), an inference key and a
 * cluster secret. Pod a serves `both`, pod b serves `both` and `only-b`, pod c serves `only-c`.
 * A chat sent to a for `only-b` crosses one signed hop to b's gateway; b answers from its own
 * instances and never relays further.
 */
const SECRET = 'cluster-hop-secret-for-tests-0123'
const KEY = 'inference-key-for-hop-tests'
const PASSWORD = 'hop-test-admin-password'
const AUTH = {
  CLUSTER_SECRET: SECRET,
  INFERENCE_API_KEY: KEY,
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'jwt-secret-for-the-cluster-hop-tests-0123456789',
}
const IDS = ['a', 'b', 'c'] as const
type PodId = (typeof IDS)[number]

function clusterYaml(id: string, ports: Record<string, number>): string {
  const list = Object.entries(ports)
    .map(([pod, p]) => `{ pod_id: ${pod}, address: 'http://127.0.0.1:${p}' }`)
    .join(', ')
  // A long heartbeat: tables reach the pods by events, and a table the test hands pod a stays.
  return `
  cluster:
    pod_id: ${id}
    advertise_address: http://127.0.0.1:${ports[id]}
    expected_size: 3
    heartbeat_interval_ms: 60000
    coordination:
      kind: static
      static: { leader: c, peers: [${list}] }`
}

const pods = {} as Record<PodId, TestGateway>
const ports = {} as Record<PodId, number>
const tokens = {} as Record<PodId, string>
/** Instance ids by pod and served name. */
const instances = {} as Record<PodId, Record<string, string>>

/** The test's own internal calls, as pod c (the leader, which leadWith plays): pods take calls from members only. */
const peers = new PeerClient({
  secret: SECRET,
  podId: 'c',
  term: () => 1,
  timeoutMs: 10_000,
  log: new Logger('error', 'test', 'text', () => {}),
})

async function admin<T>(pod: PodId, path: string, init: RequestInit = {}) {
  return pods[pod].json<T>(path, { ...init, headers: { authorization: `Bearer ${tokens[pod]}` } })
}

async function load(pod: PodId, name: string): Promise<void> {
  const r = await admin<{ instance_id: string }>(pod, '/api/v1/models/load', {
    method: 'POST',
    body: JSON.stringify({
      model_path: `org/${name}`,
      served_model_name: name,
      gpu_memory_utilization: 0.3,
      enable_sleep_mode: true,
    }),
  })
  expect(r.status).toBe(202)
  const id = r.body.instance_id
  await waitFor(
    `${name} active on pod ${pod}`,
    async () =>
      (await admin<{ model: { status: string } }>(pod, `/api/v1/models/${id}`)).body.model?.status ===
      'active',
    { timeoutMs: 30_000, wake: (notify) => pods[pod].host.bus.on('gateway.instance.status', notify) },
  )
  instances[pod] = { ...instances[pod], [name]: id }
}

const chatBody = (model: string, stream: boolean) =>
  JSON.stringify({
    model,
    messages: [{ role: 'user', content: `count for ${model}` }],
    max_tokens: 12,
    ignore_eos: true,
    stream,
  })

function chat(pod: PodId, model: string, stream: boolean, key: string | null = KEY): Promise<Response> {
  return fetch(`${pods[pod].url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: chatBody(model, stream),
  })
}

/** streamed: the content deltas of a whole 200 event stream, and whether it ended with [DONE]. */
async function streamed(res: Response): Promise<{ content: string; chunks: number; done: boolean }> {
  expect(res.status).toBe(200)
  expect(res.headers.get('content-type')).toContain('text/event-stream')
  const text = await res.text()
  let content = ''
  let chunks = 0
  for (const frame of text.split('\n\n')) {
    if (!frame.startsWith('data: {')) continue
    const chunk = JSON.parse(frame.slice(6)) as { choices: { delta?: { content?: string } }[] }
    const piece = chunk.choices[0]?.delta?.content ?? ''
    if (piece) chunks++
    content += piece
  }
  return { content, chunks, done: text.endsWith('data: [DONE]\n\n') }
}

/** metric: the value of one series on a pod's /metrics (0 when absent), its labels in any order. */
async function metric(pod: PodId, name: string, labels: Record<string, string>): Promise<number> {
  const text = await (await fetch(`${pods[pod].url}/metrics`)).text()
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`)
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue
    const inside = line.slice(name.length + 1, line.indexOf('}'))
    const have = inside.split(',')
    if (want.length === have.length && want.every((w) => have.includes(w)))
      return Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return 0
}

const served = (pod: PodId, name: string) =>
  metric(pod, 'modelgate_requests_total', { model_id: instances[pod]![name]!, status: '200' })
const hops = (pod: PodId, model: string, to: string, outcome: string) =>
  metric(pod, 'modelgate_cluster_hops_total', { model, pod: to, outcome })

async function errorOf(res: Response): Promise<{ code: string; type: string; param?: string }> {
  return ((await res.json()) as { error: { code: string; type: string; param?: string } }).error
}

describe('cluster inference hop', () => {
  beforeAll(async () => {
    for (const id of IDS) ports[id] = await freePort()
    for (const [i, id] of IDS.entries()) {
      pods[id] = await startGateway({
        ports: [8700 + i * 10, 8709 + i * 10],
        extraYaml: clusterYaml(id, ports),
        hostEnv: AUTH,
        server: { port: ports[id] },
      })
      const login = await pods[id].json<{ token: string }>('/api/auth/login', {
        method: 'POST',
        body: JSON.stringify({ username: 'admin', password: PASSWORD }),
      })
      tokens[id] = login.body.token
    }
    await Promise.all([
      load('a', 'both').then(() => load('b', 'both')),
      load('b', 'only-b'),
      load('c', 'only-c'),
    ])
    await waitFor('every pod routes only-b, only-c and both (twice)', async () => {
      const tables = await Promise.all(
        IDS.map((id) => admin<RoutingTable>(id, '/api/cluster/routing-table').then((r) => r.body)),
      )
      return tables.every(
        (t) =>
          t.entries['only-b']?.length === 1 &&
          t.entries['only-c']?.length === 1 &&
          t.entries.both?.length === 2,
      )
    })
  }, 120_000)

  afterAll(async () => {
    for (const id of IDS) await pods[id]?.stop()
  })

  it('streams a chat for a model only pod b serves through pod a, token for token, counted on both', async () => {
    const servedBefore = await served('b', 'only-b')
    const hopsBefore = await hops('a', 'only-b', 'b', 'ok')
    const viaA = await streamed(await chat('a', 'only-b', true))
    expect(viaA.done).toBe(true)
    expect(viaA.chunks).toBe(12)
    // The same request sent to pod b itself: the simulator's answer depends only on the request.
    const atB = await streamed(await chat('b', 'only-b', true))
    expect(viaA.content).toBe(atB.content)
    expect(await served('b', 'only-b')).toBe(servedBefore + 2)
    expect(await hops('a', 'only-b', 'b', 'ok')).toBe(hopsBefore + 1)
    // Pod a counts the relayed request as a proxied one, by served model name.
    expect(
      await metric('a', 'modelgate_requests_total', { model_id: 'only-b', status: '200' }),
    ).toBeGreaterThan(0)
  })

  it('relays a whole JSON answer too', async () => {
    const res = await chat('a', 'only-c', false)
    expect(res.status).toBe(200)
    const body = (await res.json()) as { model: string; choices: { message: { content: string } }[] }
    expect(body.model).toBe('only-c')
    expect(body.choices[0]!.message.content.split(' ').filter(Boolean).length).toBe(12)
  })

  it("drops a client's own X-Cluster-* headers from the hop (ours alone reach pod b), so the chat still goes through", async () => {
    const before = await served('b', 'only-b')
    const res = await fetch(`${pods.a.url}/v1/chat/completions`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        authorization: `Bearer ${KEY}`,
        'X-Cluster-Signature': 'f'.repeat(64),
        'x-cluster-timestamp': '1',
        'X-Cluster-Pod': 'mallory',
        'X-CLUSTER-TERM': '999999',
      },
      body: chatBody('only-b', false),
    })
    expect(res.status).toBe(200)
    expect(((await res.json()) as { model: string }).model).toBe('only-b')
    expect(await served('b', 'only-b')).toBe(before + 1)
    // The client's term was not believed: pod b's term is what it was.
    const status = await admin<{ term: number }>('b', '/api/cluster')
    expect(status.body.term).toBeLessThan(999999)
  })

  it('asks for the inference key at the edge, before any hop', async () => {
    const before = await served('b', 'only-b')
    const res = await chat('a', 'only-b', true, null)
    expect(res.status).toBe(401)
    expect((await errorOf(res)).code).toBe('missing_api_key')
    expect((await chat('a', 'only-b', true, 'wrong-key')).status).toBe(401)
    expect(await served('b', 'only-b')).toBe(before)
  })

  it("refuses pod b's hop route without a valid signature, even with the inference key", async () => {
    const before = await served('b', 'only-b')
    const path = '/internal/v1/v1/chat/completions'
    const body = chatBody('only-b', false)
    const unsigned = await fetch(`${pods.b.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body,
    })
    expect(unsigned.status).toBe(401)
    // Signed with another secret, everything else as pod a would send it: the signature refuses it.
    const stamp = Date.now()
    const target = `${path}?to=b`
    const forged = await fetch(`${pods.b.url}${target}`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        authorization: `Bearer ${KEY}`,
        'x-cluster-pod': 'a',
        'x-cluster-timestamp': String(stamp),
        'x-cluster-signature': signRequest(
          'not-the-cluster-secret-0123',
          'POST',
          target,
          stamp,
          Buffer.from(body),
        ),
      },
      body,
    })
    expect(forged.status).toBe(401)
    expect(((await forged.json()) as { error: { message: string } }).error.message).toBe(
      'Invalid cluster signature',
    )
    expect(await served('b', 'only-b')).toBe(before)
  })

  it('answers 400 invalid_model for a model no pod serves', async () => {
    const res = await chat('a', 'nowhere', true)
    expect(res.status).toBe(400)
    expect(await errorOf(res)).toMatchObject({
      code: 'invalid_model',
      type: 'invalid_request_error',
      param: 'model',
    })
  })

  it('answers a hop for a model the pod lacks with 400, never relaying it again', async () => {
    const before = await served('c', 'only-c')
    const err = await peers
      .request(
        { podId: 'b', address: pods.b.url },
        'POST',
        '/internal/v1/v1/chat/completions',
        JSON.parse(chatBody('only-c', false)),
      )
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(PeerError)
    expect(err).toMatchObject({ status: 400, code: 'invalid_model' })
    // Pod c holds only-c and b's table says so: no second hop reached it.
    expect(await served('c', 'only-c')).toBe(before)
    expect(await hops('b', 'only-c', 'c', 'ok')).toBe(0)
    // A signed hop for a model b holds is served from its own instance.
    const ok = await peers.request<{ model: string }>(
      { podId: 'b', address: pods.b.url },
      'POST',
      '/internal/v1/v1/chat/completions?hop=test.1',
      JSON.parse(chatBody('only-b', false)),
    )
    expect(ok.model).toBe('only-b')
  })

  it("relays Anthropic's Messages API through the hop, plain and streamed, and refuses it in Anthropic's shape", async () => {
    const client = new Anthropic({ baseURL: pods.a.url, apiKey: KEY, maxRetries: 0, timeout: 20_000 })
    const before = await served('b', 'only-b')
    const msg = await client.messages.create({
      model: 'only-b',
      max_tokens: 5,
      messages: [{ role: 'user', content: 'hello b' }],
    })
    expect([msg.type, msg.model]).toEqual(['message', 'only-b'])
    expect(msg.usage.output_tokens).toBeGreaterThan(0)
    const stream = await client.messages.create({
      model: 'only-b',
      max_tokens: 5,
      messages: [{ role: 'user', content: 'hello b' }],
      stream: true,
    })
    const types: string[] = []
    for await (const ev of stream) types.push(ev.type)
    expect([types[0], types.at(-1)]).toEqual(['message_start', 'message_stop'])
    expect(await served('b', 'only-b')).toBe(before + 2)
    // No pod serves it: Anthropic's 404, from the edge.
    const unknown = await client.messages
      .create({ model: 'nowhere', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e)
    expect(unknown).toBeInstanceOf(Anthropic.NotFoundError)
    expect((unknown as InstanceType<typeof Anthropic.APIError>).error).toMatchObject({
      type: 'error',
      error: { type: 'not_found_error' },
    })
    // A hop for a model the receiving pod lacks is refused in the Messages API's shape too (the
    // edge relays that answer to the client as it is).
    const hopped = await peers
      .request({ podId: 'b', address: pods.b.url }, 'POST', '/internal/v1/v1/messages', {
        model: 'only-c',
        max_tokens: 5,
        messages: [{ role: 'user', content: 'x' }],
      })
      .catch((e: unknown) => e)
    expect(hopped).toBeInstanceOf(PeerError)
    expect((hopped as PeerError).status).toBe(404)
  })

  it('serves a model from its own instance when the pod holds it', async () => {
    const [atA, atB] = [await served('a', 'both'), await served('b', 'both')]
    for (let i = 0; i < 4; i++) expect((await streamed(await chat('a', 'both', true))).done).toBe(true)
    expect(await served('a', 'both')).toBe(atA + 4)
    expect(await served('b', 'both')).toBe(atB)
    expect(await hops('a', 'both', 'b', 'ok')).toBe(0)
  })

  it("lists the cluster's models on /v1/models, local ones first", async () => {
    const res = await fetch(`${pods.a.url}/v1/models`, { headers: { authorization: `Bearer ${KEY}` } })
    const list = (await res.json()) as {
      data: { id: string; pod_id?: string; instance_id: string; state: string }[]
    }
    expect(list.data.map((m) => m.id)).toEqual(['both', 'only-b', 'only-c'])
    expect(list.data[0]).toMatchObject({ state: 'active', instance_id: instances.a!.both! })
    expect(list.data[1]).toMatchObject({ state: 'active', pod_id: 'b', instance_id: instances.b!['only-b'] })
    expect(list.data[2]).toMatchObject({ state: 'active', pod_id: 'c', instance_id: instances.c!['only-c'] })
  })

  it('documents the hop route in /docs as an internal (signed) route', async () => {
    const docs = (await (await fetch(`${pods.a.url}/docs/json`)).json()) as {
      paths: Record<string, Record<string, { 'x-auth'?: string }>>
    }
    expect(docs.paths['/internal/v1/{path}']?.post?.['x-auth']).toBe('internal')
  })

  it('carries identical requests sent at once, none refused as a replay', async () => {
    const before = await hops('a', 'only-b', 'b', 'ok')
    const answers = await Promise.all(Array.from({ length: 16 }, () => chat('a', 'only-b', false)))
    expect(answers.map((r) => r.status)).toEqual(Array(16).fill(200))
    expect(await hops('a', 'only-b', 'b', 'ok')).toBe(before + 16)
  })

  it('hops to a pod where the model runs while the local instance sleeps', async () => {
    const id = instances.a!.both!
    const slept = await admin(`a`, `/api/models/instances/${id}/sleep?level=1`, { method: 'POST' })
    expect(slept.status).toBe(200)
    const atB = await served('b', 'both')
    expect((await streamed(await chat('a', 'both', true))).done).toBe(true)
    expect(await served('b', 'both')).toBe(atB + 1)
    expect(await hops('a', 'both', 'b', 'ok')).toBe(1)
    expect((await admin('a', `/api/models/instances/${id}/wake`, { method: 'POST' })).status).toBe(200)
  })

  /** leadWith: the test plays the leader: a heartbeat to pod a with a newer table, `only-b` changed by `change`. */
  async function leadWith(change: (entries: RoutingEntry[]) => RoutingEntry[]): Promise<void> {
    const current = (await admin<RoutingTable>('a', '/api/cluster/routing-table')).body
    const entries = { ...current.entries, 'only-b': change(current.entries['only-b']!) }
    const table: RoutingTable = { ...current, version: current.version + 1000, entries }
    const leader = await peers.request<InternalState>(
      { podId: 'c', address: pods.c.url },
      'GET',
      '/internal/state',
    )
    await peers.request({ podId: 'a', address: pods.a.url }, 'POST', '/internal/heartbeat', {
      state: leader.state,
      routingTable: table,
    })
  }

  it('goes on to the next pod when the table lists a dead one first', async () => {
    // A table that lists a pod nobody listens for first.
    const dead = `http://127.0.0.1:${await freePort()}`
    await leadWith((onlyB) => [{ podId: 'ghost', podAddress: dead, vllmPort: 1, weight: 1 }, ...onlyB])
    const adopted = (await admin<RoutingTable>('a', '/api/cluster/routing-table')).body
    expect(adopted.entries['only-b']!.map((e) => e.podId)).toEqual(['ghost', 'b'])
    const before = await served('b', 'only-b')
    const first = await streamed(await chat('a', 'only-b', true))
    expect(first).toMatchObject({ chunks: 12, done: true })
    expect(await hops('a', 'only-b', 'ghost', 'unreachable')).toBe(1)
    // The pod that failed to connect goes last now: the next request goes straight to b.
    expect((await streamed(await chat('a', 'only-b', true))).done).toBe(true)
    expect(await hops('a', 'only-b', 'ghost', 'unreachable')).toBe(1)
    expect(await served('b', 'only-b')).toBe(before + 2)
  })

  describe('a signed request captured on its way to pod b', () => {
    /** What the recording peer received (head and body, latin1), each answered 200 with `{}`. */
    const captured: { head: string; body: string }[] = []
    let recorder: RawHttpServer
    beforeAll(() => {
      recorder = rawHttpServer((socket, head, body) => {
        captured.push({ head, body })
        socket.write('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}')
      })
    })
    afterAll(() => recorder.stop())

    /** replay: the captured bytes, unchanged, to `pod`'s listener; its one response. */
    async function replay(pod: PodId, sent: { head: string; body: string }) {
      const reply = await rawExchange(ports[pod], `${sent.head}\r\n\r\n${sent.body}`, {
        waitMs: 10_000,
        until: (text) => parse(text).length > 0,
      })
      const res = parse(reply.text)[0]!
      return {
        status: res.status,
        error: (JSON.parse(res.body) as { error?: Record<string, unknown> }).error,
      }
    }

    /** replayedEverywhere: refused by pod c (not its destination), accepted once by b, then refused as a replay. */
    async function replayedEverywhere(sent: { head: string; body: string }, accepted: () => Promise<void>) {
      const atC = await replay('c', sent)
      expect(atC.status).toBe(403)
      expect(atC.error).toEqual({
        code: 'WRONG_DESTINATION',
        message: "Signed cluster request is for pod 'b', not this pod ('c')",
        statusCode: 403,
      })
      expect((await replay('b', sent)).status).toBe(200)
      await accepted()
      const again = await replay('b', sent)
      expect(again.status).toBe(401)
      expect(again.error?.message).toBe('Replayed cluster request')
    }

    it('a control-plane call (PeerClient): pod c refuses it, pod b takes it once', async () => {
      const to = { podId: 'b', address: `http://127.0.0.1:${recorder.port}` }
      expect(await peers.request(to, 'GET', '/internal/models')).toEqual({})
      const sent = captured.pop()!
      expect(sent.head).toStartWith('GET /internal/models?to=b HTTP/1.1')
      await replayedEverywhere(sent, async () => {})
    })

    it('an inference hop: pod c refuses it, pod b serves it once', async () => {
      // A table whose pod b listens at the recorder.
      await leadWith((onlyB) => [
        { ...onlyB.find((e) => e.podId === 'b')!, podAddress: `http://127.0.0.1:${recorder.port}` },
      ])
      const res = await chat('a', 'only-b', false)
      expect(res.status).toBe(200)
      expect(await res.json()).toEqual({})
      const sent = captured.pop()!
      expect(sent.head).toMatch(/^POST \/internal\/v1\/v1\/chat\/completions\?hop=[^&]+&to=b HTTP\/1\.1/)
      const before = await served('b', 'only-b')
      await replayedEverywhere(sent, async () => expect(await served('b', 'only-b')).toBe(before + 1))
      expect(await served('b', 'only-b')).toBe(before + 1)
    })
  })
})
