import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { RoutingTable } from '../../plugins/cluster/schemas.ts'
import { formatTraceparent, parseTraceparent } from '../../src/host/telemetry/traceparent.ts'
import { traceparentsSeen } from '../../src/sim/traces.ts'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { childrenOf, OtlpReceiver, type ReceivedSpan } from '../support/otlp-receiver.ts'
import { waitFor } from '../support/wait.ts'

/**
 * One trace across two pods: pod a has no instance of `sleepy`, pod b has one asleep and holds
 * requests while it wakes. A chat sent to pod a hops to pod b, which wakes the model and answers.
 * Both pods (real listeners, `static` coordination, the cluster signature, the inference key and
 * admin auth on) export to one OTLP receiver under their own service names; the engine on pod b
 * records the traceparent it received. The whole path is one trace, each span under the right
 * parent: a's request → the hop → b's request → held → the wake → its phase, and b's request →
 * the engine call, whose traceparent the engine got.
 */
const SECRET = 'cluster-trace-secret-for-tests-0123'
const KEY = 'inference-key-for-cluster-traces'
const PASSWORD = 'cluster-trace-admin-password'
const AUTH = {
  CLUSTER_SECRET: SECRET,
  INFERENCE_API_KEY: KEY,
  AUTH_MODE: 'simple',
  ADMIN_PASSWORD: PASSWORD,
  JWT_SECRET: 'jwt-secret-for-the-cluster-trace-tests-0123456789',
}
const IDS = ['a', 'b'] as const
type PodId = (typeof IDS)[number]
const MODEL = 'sleepy'

const pods = {} as Record<PodId, TestGateway>
const ports = {} as Record<PodId, number>
const tokens = {} as Record<PodId, string>
let receiver: OtlpReceiver
let enginePort = 0

function podYaml(id: PodId): string {
  const peers = IDS.map((p) => `{ pod_id: ${p}, address: 'http://127.0.0.1:${ports[p]}' }`).join(', ')
  return `    proxy: { wake_on_request: hold, hold_timeout: 30 }
  cluster:
    pod_id: ${id}
    advertise_address: http://127.0.0.1:${ports[id]}
    expected_size: 2
    heartbeat_interval_ms: 60000
    coordination:
      kind: static
      static: { leader: b, peers: [${peers}] }
telemetry: { otlp_endpoint: '${receiver.url}', service_name: pod-${id} }
`
}

function admin<T>(pod: PodId, path: string, init: RequestInit = {}) {
  return pods[pod].json<T>(path, { ...init, headers: { authorization: `Bearer ${tokens[pod]}` } })
}

beforeAll(async () => {
  receiver = new OtlpReceiver()
  for (const id of IDS) ports[id] = await freePort()
  for (const [i, id] of IDS.entries()) {
    pods[id] = await startGateway({
      ports: [23620 + i * 10, 23629 + i * 10],
      env: { SIM_WAKE_DELAY_MS: '600' },
      extraYaml: podYaml(id),
      hostEnv: AUTH,
      server: { port: ports[id] },
    })
    const login = await pods[id].json<{ token: string }>('/api/auth/login', {
      method: 'POST',
      body: JSON.stringify({ username: 'admin', password: PASSWORD }),
    })
    tokens[id] = login.body.token
  }
  const loaded = await admin<{ instance_id: string }>('b', '/api/v1/models/load', {
    method: 'POST',
    body: JSON.stringify({
      model_path: `org/${MODEL}`,
      served_model_name: MODEL,
      gpu_memory_utilization: 0.3,
      enable_sleep_mode: true,
    }),
  })
  expect(loaded.status).toBe(202)
  const id = loaded.body.instance_id
  const model = await waitFor(
    `${MODEL} active on pod b`,
    async () => {
      const m = (await admin<{ model: { status: string; port: number } }>('b', `/api/v1/models/${id}`)).body
        .model
      return m?.status === 'active' ? m : undefined
    },
    { timeoutMs: 30_000, wake: (notify) => pods.b.host.bus.on('gateway.instance.status', notify) },
  )
  enginePort = model.port
  expect((await admin('b', `/api/models/instances/${id}/sleep?level=1`, { method: 'POST' })).status).toBe(200)
  await waitFor(`pod a routes ${MODEL} to pod b, asleep`, async () => {
    const t = (await admin<RoutingTable>('a', '/api/cluster/routing-table')).body
    return (
      t.entries[MODEL]?.length === 1 &&
      t.entries[MODEL][0]!.podId === 'b' &&
      t.entries[MODEL][0]!.weight === 0
    )
  })
}, 120_000)

afterAll(async () => {
  for (const id of IDS) await pods[id]?.stop()
  receiver.stop()
})

describe('a trace across two pods', () => {
  it('draws the hop, the wake on the serving pod and its engine call in one trace', async () => {
    const res = await fetch(`${pods.a.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({
        model: MODEL,
        messages: [{ role: 'user', content: 'wake up' }],
        max_tokens: 6,
        ignore_eos: true,
        stream: true,
        stream_options: { include_usage: true },
      }),
    })
    expect(res.status).toBe(200)
    expect((await res.text()).endsWith('data: [DONE]\n\n')).toBe(true)
    const received = traceparentsSeen(pods.b.simDir, enginePort)
    expect(received).toHaveLength(1)
    const tp = parseTraceparent(received[0]!.traceparent)!
    const expected = ['pod-a', 'pod-b']
    await receiver.waitForSpans((all) => {
      const mine = all.filter((s) => s.traceId === tp.traceId)
      return (
        mine.some((s) => s.name === 'engine.call') &&
        mine.some((s) => s.name === 'cluster.hop') &&
        expected.every((svc) => mine.some((s) => s.kind === 2 && s.resource['service.name'] === svc))
      )
    }, 'the spans of both pods')
    const spans = receiver.trace(tp.traceId)
    const on = (svc: string) => (s: ReceivedSpan) => s.resource['service.name'] === svc
    const edge = spans.find((s) => s.kind === 2 && on('pod-a')(s))!
    const hop = spans.find((s) => s.name === 'cluster.hop')!
    const landed = spans.find((s) => s.kind === 2 && on('pod-b')(s))!
    // Pod a: its request is the root, the hop a client call under it.
    expect(edge.parentSpanId).toBe('')
    expect(edge.name).toBe('POST /v1/chat/completions')
    expect(edge.attributes).toMatchObject({
      'gen_ai.request.model': MODEL,
      'gen_ai.response.model': MODEL,
      'gen_ai.usage.output_tokens': 6,
      'gen_ai.response.finish_reasons': ['length'],
      'http.response.status_code': 200,
    })
    expect(edge.attributes['gen_ai.server.time_to_first_token']).toBeGreaterThan(0)
    expect(childrenOf(spans, edge).map((s) => s.name)).toEqual(['cluster.hop'])
    expect(hop.kind).toBe(3)
    expect(hop.attributes).toMatchObject({
      'modelgate.pod_id': 'b',
      'server.port': ports.b,
      'url.path': '/internal/v1/v1/chat/completions',
      'http.response.status_code': 200,
    })
    // Pod b: its request under the hop, held while the model woke, then the engine call.
    expect(landed.parentSpanId).toBe(hop.spanId)
    expect(landed.attributes).toMatchObject({
      'http.route': '/v1/chat/completions',
      'url.path': '/internal/v1/v1/chat/completions',
      'gen_ai.operation.name': 'chat',
      'gen_ai.request.model': MODEL,
      'modelgate.hop.from_pod': 'a',
      'gen_ai.usage.output_tokens': 6,
      'http.response.status_code': 200,
    })
    const onB = spans.filter(on('pod-b'))
    expect(childrenOf(onB, landed).map((s) => s.name)).toEqual(['modelgate.hold', 'engine.call'])
    const hold = onB.find((s) => s.name === 'modelgate.hold')!
    expect(hold.attributes['modelgate.hold.outcome']).toBe('awake')
    const wake = onB.find((s) => s.name === 'gateway.wake')!
    expect(wake.parentSpanId).toBe(hold.spanId)
    expect(childrenOf(onB, wake).map((s) => s.name)).toEqual(['wake.wake_up'])
    const call = onB.find((s) => s.name === 'engine.call')!
    expect(received[0]!.traceparent).toBe(formatTraceparent(tp.traceId, call.spanId, 1))
    // Nothing else in the trace: one request, one trace.
    expect(spans.map((s) => s.name).sort()).toEqual(
      [
        'POST /v1/chat/completions',
        'cluster.hop',
        'POST /v1/chat/completions',
        'modelgate.hold',
        'gateway.wake',
        'wake.wake_up',
        'engine.call',
      ].sort(),
    )
  })
})
