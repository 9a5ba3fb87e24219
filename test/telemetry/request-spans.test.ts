import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { rmSync } from 'node:fs'
import { formatTraceparent, parseTraceparent } from '../../src/host/telemetry/traceparent.ts'
import { traceparentsSeen } from '../../src/sim/traces.ts'
import { routerPlugin, routerYaml } from '../router/support.ts'
import { cleanupSims, type EngineProc, spawnEngine, tempSimDir, waitHealthy } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { childrenOf, OtlpReceiver, type ReceivedSpan } from '../support/otlp-receiver.ts'
import { parse, rawExchange } from '../support/raw-client.ts'

/**
 * One trace per inference request, through real sockets: a gateway with the inference key on,
 * driving simulated engines, exports with the real OTLP exporter to a receiver at the process
 * boundary, and the simulator records the `traceparent` each engine received. The server span of
 * the request (HTTP and GenAI attributes, usage read from the engine's answer, time to first
 * token), the engine call under it, a held request's wait with the wake and its vLLM phases, the
 * direct proxy, the router's listener; an incoming traceparent honoured; spans of a request still
 * streaming at shutdown sent before the host is gone; and with tracing off, nothing sent and the
 * client's traceparent passed on untouched.
 */
const KEY = 'sk-request-spans'
const MODEL = 'traced-model'
const SERVER_SPAN = 'POST /v1/chat/completions'

let receiver: OtlpReceiver
let gw: TestGateway
let port = 0
let instanceId = ''

function chat(url: string, body: Record<string, unknown>, headers: Record<string, string> = {}) {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, ...headers },
    body: JSON.stringify({
      model: MODEL,
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 5,
      ...body,
    }),
  })
}

/**
 * requestTrace: the trace of the `nth` request the engine on `enginePort` received (its traceparent
 * names the engine call's span), once the engine call and the server span above it are in.
 */
async function requestTrace(
  simDir: string,
  enginePort: number,
  nth: number,
  r: OtlpReceiver = receiver,
): Promise<{ spans: ReceivedSpan[]; server: ReceivedSpan; call: ReceivedSpan; sent: string }> {
  const sent = traceparentsSeen(simDir, enginePort)[nth]!.traceparent
  const tp = parseTraceparent(sent)!
  const callOf = (all: ReceivedSpan[]) => all.find((s) => s.spanId === tp.spanId)
  await r.waitForSpans((all) => {
    const call = callOf(all)
    return call !== undefined && all.some((s) => s.spanId === call.parentSpanId)
  }, `the engine call ${tp.spanId} of trace ${tp.traceId} and the span above it`)
  const spans = r.trace(tp.traceId)
  const call = callOf(spans)!
  return { spans, server: spans.find((s) => s.spanId === call.parentSpanId)!, call, sent }
}

/** Span clocks: each span's start is read from Date.now() (whole ms), its end is start + its duration. */
const CLOCK_MS = 1

const seen = () => traceparentsSeen(gw.simDir, port)

beforeAll(async () => {
  receiver = new OtlpReceiver()
  gw = await startGateway({
    ports: [23600, 23609],
    env: { SIM_WAKE_DELAY_MS: '900', SIM_TOKENS_PER_SEC: '400' },
    hostEnv: { INFERENCE_API_KEY: KEY },
    drainMs: 10_000,
    extraYaml:
      '    proxy: { wake_on_request: hold, hold_timeout: 30 }\n' +
      `telemetry: { otlp_endpoint: '${receiver.url}', service_name: gw-requests }\n`,
  })
  instanceId = await gw.load({
    model_path: 'Qwen/Qwen2.5-0.5B',
    served_model_name: MODEL,
    enable_sleep_mode: true,
    gpu_ids: [0],
  })
  port = Number((await gw.waitStatus(instanceId, 'active')).port)
}, 60_000)

afterAll(async () => {
  await gw?.stop()
  receiver.stop()
})

describe('request traces on the gateway', () => {
  it('makes one trace per request: the server span, the engine call under it, its traceparent sent to the engine', async () => {
    const res = await chat(gw.url, {})
    expect(res.status).toBe(200)
    const answer = (await res.json()) as { usage: { prompt_tokens: number; completion_tokens: number } }
    expect(seen()).toHaveLength(1)
    const { spans, server, call, sent } = await requestTrace(gw.simDir, port, 0)
    expect(spans.map((s) => s.name).sort()).toEqual([SERVER_SPAN, 'engine.call'])
    expect(server.attributes).toMatchObject({
      'http.request.method': 'POST',
      'http.route': '/v1/chat/completions',
      'url.path': '/v1/chat/completions',
      'http.response.status_code': 200,
      'server.address': '127.0.0.1',
      'server.port': Number(new URL(gw.url).port),
      'client.address': '127.0.0.1',
      'gen_ai.operation.name': 'chat',
      'gen_ai.request.model': MODEL,
      'gen_ai.response.model': MODEL,
      'gen_ai.usage.input_tokens': answer.usage.prompt_tokens,
      'gen_ai.usage.output_tokens': answer.usage.completion_tokens,
      'gen_ai.response.finish_reasons': ['length'],
    })
    expect(server.status.code).toBe(0)
    expect(server.resource['service.name']).toBe('gw-requests')
    // The engine call: a client span under the server span, the engine's address and answer.
    expect(call.parentSpanId).toBe(server.spanId)
    expect(call.kind).toBe(3)
    expect(call.attributes).toMatchObject({
      'server.address': '127.0.0.1',
      'server.port': port,
      'url.path': '/v1/chat/completions',
      'http.response.status_code': 200,
    })
    expect(sent).toBe(formatTraceparent(server.traceId, call.spanId, 1))
    // A whole answer has no first token of its own (like modelgate_request_ttft_seconds).
    expect(server.attributes['gen_ai.server.time_to_first_token']).toBeUndefined()
    expect(call.start).toBeGreaterThanOrEqual(server.start - CLOCK_MS)
    expect(call.end).toBeLessThanOrEqual(server.end + CLOCK_MS)
  })

  it('reads a stream: time to first token, the usage chunk and the finish reason', async () => {
    const res = await chat(gw.url, { stream: true, stream_options: { include_usage: true }, max_tokens: 7 })
    expect(res.status).toBe(200)
    const text = await res.text()
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true)
    const { server } = await requestTrace(gw.simDir, port, 1)
    expect(server.attributes).toMatchObject({
      'http.response.status_code': 200,
      'gen_ai.usage.output_tokens': 7,
      'gen_ai.response.finish_reasons': ['length'],
    })
    expect(server.attributes['gen_ai.usage.input_tokens']).toBeGreaterThan(0)
    const ttft = server.attributes['gen_ai.server.time_to_first_token'] as number
    expect(ttft).toBeGreaterThan(0)
    expect(ttft).toBeLessThan((server.end - server.start) / 1000)
    expect(server.events.map((e) => e.name)).toContain('gen_ai.first_token')
    // Without include_usage: a request with a key is counted, so the engine is asked for its usage
    // chunk, which the span reads and the client never sees.
    const plain = await chat(gw.url, { stream: true, max_tokens: 3 })
    const plainText = await plain.text()
    expect(plainText).not.toContain('"usage":{')
    expect(plainText.endsWith('data: [DONE]\n\n')).toBe(true)
    const second = await requestTrace(gw.simDir, port, 2)
    expect(second.server.attributes['gen_ai.response.finish_reasons']).toEqual(['length'])
    expect(second.server.attributes['gen_ai.usage.output_tokens']).toBe(3)
  })

  it("joins the trace of the client's traceparent, and sends the engine its own span's instead", async () => {
    const incoming = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
    const res = await chat(gw.url, {}, { traceparent: incoming })
    expect(res.status).toBe(200)
    await res.text()
    const { server, call, sent } = await requestTrace(gw.simDir, port, 3)
    expect(server.traceId).toBe('4bf92f3577b34da6a3ce929d0e0e4736')
    expect(server.parentSpanId).toBe('00f067aa0ba902b7')
    expect(sent).not.toBe(incoming)
    expect(sent).toBe(formatTraceparent(server.traceId, call.spanId, 1))
  })

  it('draws a held request: its wait, the wake it started with each vLLM phase, then the engine call', async () => {
    const id = instanceId
    const slept = await gw.json(`/api/models/instances/${id}/sleep?level=2`, { method: 'POST' })
    expect(slept.status).toBe(200)
    // Two requests at once: the first starts the wake, the second joins it.
    const answers = await Promise.all([chat(gw.url, {}), chat(gw.url, {})])
    expect(answers.map((r) => r.status)).toEqual([200, 200])
    await Promise.all(answers.map((r) => r.text()))
    const traces = await Promise.all([requestTrace(gw.simDir, port, 4), requestTrace(gw.simDir, port, 5)])
    await receiver.waitForSpans(
      () => traces.every((t) => receiver.trace(t.server.traceId).some((s) => s.name === 'modelgate.hold')),
      'both hold spans',
    )
    const woke = traces.filter((t) => receiver.trace(t.server.traceId).some((s) => s.name === 'gateway.wake'))
    expect(woke).toHaveLength(1)
    for (const t of traces) {
      const spans = receiver.trace(t.server.traceId)
      const hold = spans.find((s) => s.name === 'modelgate.hold')!
      expect(hold.parentSpanId).toBe(t.server.spanId)
      expect(hold.attributes).toMatchObject({
        'modelgate.hold.outcome': 'awake',
        'modelgate.hold.queued': false,
        'gen_ai.request.model': MODEL,
      })
      // server → hold, then the engine call once awake.
      expect(childrenOf(spans, t.server).map((s) => s.name)).toEqual(['modelgate.hold', 'engine.call'])
      expect(t.call.start).toBeGreaterThanOrEqual(hold.end - CLOCK_MS)
    }
    const waker = receiver.trace(woke[0]!.server.traceId)
    const hold = waker.find((s) => s.name === 'modelgate.hold')!
    const wake = waker.find((s) => s.name === 'gateway.wake')!
    expect(wake.parentSpanId).toBe(hold.spanId)
    expect(wake.attributes['modelgate.instance_id']).toBe(id)
    // Level 2: weights, reload_weights, kv_cache, reset_prefix_cache (vLLM's documented sequence).
    expect(childrenOf(waker, wake).map((s) => s.name)).toEqual([
      'wake.weights',
      'wake.reload_weights',
      'wake.kv_cache',
      'wake.reset_prefix_cache',
    ])
    const joiner = traces.find((t) => t !== woke[0])!
    const joinedHold = receiver.trace(joiner.server.traceId).find((s) => s.name === 'modelgate.hold')!
    expect(joinedHold.events.map((e) => e.name)).toContain('modelgate.wake.joined')
  })

  it('traces the direct proxy under its route, and a refusal with its status', async () => {
    const res = await fetch(`${gw.url}/api/direct/${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: MODEL, prompt: 'hello', max_tokens: 2 }),
    })
    expect(res.status).toBe(200)
    await res.text()
    const { server, call } = await requestTrace(gw.simDir, port, 6)
    expect(server.name).toBe('POST /api/direct/{port}/v1/completions')
    expect(server.attributes).toMatchObject({
      'http.route': '/api/direct/{port}/v1/completions',
      'url.path': `/api/direct/${port}/v1/completions`,
      'gen_ai.operation.name': 'text_completion',
      'gen_ai.request.model': MODEL,
      'gen_ai.response.model': MODEL,
      'gen_ai.usage.output_tokens': 2,
      'http.response.status_code': 200,
    })
    expect(call.parentSpanId).toBe(server.spanId)
    // A model nobody serves: 400, traced, not an error of the server's.
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
    const refused = await chat(gw.url, { model: 'nobody-serves-this' }, { traceparent })
    expect(refused.status).toBe(400)
    await refused.text()
    await gw.host.telemetry.flush()
    await receiver.waitForSpans(
      (all) => all.some((s) => s.traceId === '0af7651916cd43dd8448eb211c80319c'),
      'the refused request',
    )
    const [span, ...rest] = receiver.trace('0af7651916cd43dd8448eb211c80319c')
    expect(rest).toEqual([])
    expect(span!.attributes).toMatchObject({
      'http.response.status_code': 400,
      'gen_ai.request.model': 'nobody-serves-this',
    })
    expect(span!.status.code).toBe(0)
    expect(seen()).toHaveLength(7)
  })

  it('sends the spans of a request still streaming when the host stops, before it is gone', async () => {
    const res = await chat(gw.url, { stream: true, max_tokens: 200, ignore_eos: true })
    expect(res.status).toBe(200)
    const body = res.text()
    const tp = parseTraceparent(seen()[7]!.traceparent)!
    // The listener stops and drains: the stream runs to its end, then everything queued is sent.
    await gw.stop()
    expect((await body).endsWith('data: [DONE]\n\n')).toBe(true)
    const spans = receiver.trace(tp.traceId)
    expect(spans.map((s) => s.name).sort()).toEqual([SERVER_SPAN, 'engine.call'])
    const server = spans.find((s) => s.name === SERVER_SPAN)!
    expect(server.attributes['http.response.status_code']).toBe(200)
    expect(server.attributes['gen_ai.response.finish_reasons']).toEqual(['length'])
  })
})

describe('request traces: the Host a client names, and a client trace not sampled', () => {
  let own: TestGateway
  let ownReceiver: OtlpReceiver
  let ownPort = 0
  const ownSeen = () => traceparentsSeen(own.simDir, ownPort)

  beforeAll(async () => {
    ownReceiver = new OtlpReceiver()
    own = await startGateway({
      ports: [23650, 23659],
      hostEnv: { INFERENCE_API_KEY: KEY },
      extraYaml: `telemetry: { otlp_endpoint: '${ownReceiver.url}', service_name: gw-hosts }\n`,
    })
    const id = await own.load({ model_path: 'Qwen/Qwen2.5-0.5B', served_model_name: MODEL, gpu_ids: [0] })
    ownPort = Number((await own.waitStatus(id, 'active')).port)
  }, 60_000)

  afterAll(async () => {
    await own?.stop()
    ownReceiver?.stop()
  })

  it('names the server by the Host the client sent, read through a raw socket with the key on', async () => {
    const listenerPort = Number(new URL(own.url).port)
    const body = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 })
    // [Host, the status, server.address, server.port]
    const cases: [string, number, string, number][] = [
      ['localhost', 200, 'localhost', listenerPort], // no port: the listener's
      ['[::1]:8443', 200, '[::1]', 8443], // an IPv6 literal and its port
      ['gw.example:notaport', 400, '', 0], // not a Host: refused by the front
    ]
    for (const [host, status, address, serverPort] of cases) {
      const nth = ownSeen().length
      const head =
        `POST /v1/chat/completions HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${KEY}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`
      const { text } = await rawExchange(listenerPort, head + body, { waitMs: 30_000 })
      expect([host, parse(text)[0]?.status]).toEqual([host, status])
      if (status === 400) {
        // Refused before any route: no call to the engine.
        expect(ownSeen()).toHaveLength(nth)
        continue
      }
      const { server } = await requestTrace(own.simDir, ownPort, nth, ownReceiver)
      expect([host, server.attributes['server.address'], server.attributes['server.port']]).toEqual([
        host,
        address,
        serverPort,
      ])
    }
  })

  it('passes an unsampled trace on, marked unsampled, and exports nothing of it', async () => {
    const traceId = '6e0c63257de34c92bf9efcd03927272e'
    const nth = ownSeen().length
    const res = await chat(own.url, {}, { traceparent: `00-${traceId}-00f067aa0ba902b7-00` })
    expect(res.status).toBe(200)
    const sent = parseTraceparent(ownSeen()[nth]!.traceparent)!
    // The client's trace and decision go on; the parent the engine gets is this gateway's, not the client's.
    expect(sent.traceId).toBe(traceId)
    expect(sent.flags).toBe(0)
    expect(sent.spanId).toMatch(/^[0-9a-f]{16}$/)
    expect(sent.spanId).not.toBe('00f067aa0ba902b7')
    // A sampled request after it: once its spans are in, any of the unsampled one would be too
    // (spans leave in the order they end, one export at a time).
    expect((await chat(own.url, {})).status).toBe(200)
    await requestTrace(own.simDir, ownPort, nth + 1, ownReceiver)
    expect(ownReceiver.spans.filter((s) => s.traceId === traceId)).toEqual([])
  })
})

describe('request traces on the router', () => {
  let engine: EngineProc
  let router: TestHost
  let simDir: string

  beforeAll(async () => {
    simDir = tempSimDir()
    engine = await spawnEngine('org/routed', ['--sim-dir', simDir, '--sim-gpus', '1x80'], {})
    await waitHealthy(engine, 20_000)
    router = await startHost(
      `telemetry: { otlp_endpoint: '${receiver.url}', service_name: router-requests }\nplugins:\n${routerYaml(
        `models:\n  - { name: 'org/routed', endpoint: { host: 127.0.0.1, port: ${engine.port} } }`,
      )}`,
      [routerPlugin],
    )
  }, 30_000)

  afterAll(async () => {
    await router?.stop()
    engine?.proc.kill('SIGKILL')
    await cleanupSims()
    rmSync(simDir, { recursive: true, force: true })
  })

  it("traces a request on the router's listener, with its call to the configured endpoint", async () => {
    const url = router.host.urls.router!
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'org/routed',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 3,
      }),
    })
    expect(res.status).toBe(200)
    await res.text()
    const { spans, server, call } = await requestTrace(simDir, engine.port, 0)
    expect(spans).toHaveLength(2)
    expect(server.resource['service.name']).toBe('router-requests')
    expect(server.attributes).toMatchObject({
      'http.route': '/v1/chat/completions',
      'server.port': Number(new URL(url).port),
      'gen_ai.request.model': 'org/routed',
      'gen_ai.response.model': 'org/routed',
      'gen_ai.usage.output_tokens': 3,
      'http.response.status_code': 200,
    })
    expect(call.parentSpanId).toBe(server.spanId)
    expect(call.attributes).toMatchObject({
      'server.port': engine.port,
      'modelgate.endpoint': 'endpoint:org/routed',
    })
  })
})

describe('request traces of a model served on demand', () => {
  it('draws the queued wait and, under it, the load it started with its phases, then the engine call', async () => {
    const r = new OtlpReceiver()
    const od = await startGateway({
      ports: [23650, 23659],
      env: { SIM_LOAD_DELAY_MS: '300' },
      hostEnv: { INFERENCE_API_KEY: KEY },
      extraYaml:
        '    residency: { policy: cost }\n' +
        '    catalog:\n' +
        '      - { name: on-demand, model_path: Qwen/Qwen2.5-0.5B, gpu_memory_utilization: 0.5 }\n' +
        `telemetry: { otlp_endpoint: '${r.url}', service_name: gw-on-demand }\n`,
    })
    try {
      const res = await chat(od.url, { model: 'on-demand' })
      expect(res.status).toBe(200)
      await res.text()
      const inst = (await od.json<{ models: { id: string; port: number }[] }>('/api/v1/models')).body
        .models[0]!
      const { server, call } = await requestTrace(od.simDir, Number(inst.port), 0, r)
      await r.waitForSpans(
        (all) => all.some((x) => x.traceId === server.traceId && x.name === 'load.ready'),
        "the load and its last phase in the request's trace",
      )
      const spans = r.trace(server.traceId)
      const hold = spans.find((x) => x.name === 'modelgate.hold')!
      expect(hold.parentSpanId).toBe(server.spanId)
      expect(hold.attributes).toMatchObject({
        'modelgate.hold.outcome': 'awake',
        'modelgate.hold.queued': true,
      })
      const load = spans.find((x) => x.name === 'gateway.load')!
      expect(load.parentSpanId).toBe(hold.spanId)
      expect(load.attributes['modelgate.instance_id']).toBe(inst.id)
      const phases = childrenOf(spans, load).map((x) => x.name)
      expect(phases.slice(0, 2)).toEqual(['load.place', 'load.spawn'])
      expect(phases.at(-1)).toBe('load.ready')
      expect(childrenOf(spans, server).map((x) => x.name)).toEqual(['modelgate.hold', 'engine.call'])
      expect(call.start).toBeGreaterThanOrEqual(hold.end - CLOCK_MS)
    } finally {
      await od.stop()
      r.stop()
    }
  }, 60_000)
})

describe('tracing off', () => {
  it('sends nothing (even with the OpenTelemetry environment set) and passes the client traceparent on as it came', async () => {
    const quiet = new OtlpReceiver()
    const saved = {
      endpoint: process.env.OTEL_EXPORTER_OTLP_ENDPOINT,
      exporter: process.env.OTEL_TRACES_EXPORTER,
    }
    process.env.OTEL_EXPORTER_OTLP_ENDPOINT = quiet.url
    process.env.OTEL_TRACES_EXPORTER = 'otlp'
    const off = await startGateway({ ports: [23640, 23649], hostEnv: { INFERENCE_API_KEY: KEY } })
    try {
      expect(off.host.telemetry.enabled).toBe(false)
      const id = await off.load({ model_path: 'Qwen/Qwen2.5-0.5B', served_model_name: MODEL, gpu_ids: [0] })
      const enginePort = Number((await off.waitStatus(id, 'active')).port)
      const incoming = '00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
      for (const headers of [{}, { traceparent: incoming }] as Record<string, string>[]) {
        const res = await chat(off.url, { stream: true }, headers)
        expect(res.status).toBe(200)
        await res.text()
      }
      // Only the client's own header reached the engine, unchanged; nothing was exported.
      expect(traceparentsSeen(off.simDir, enginePort)).toEqual([
        { traceparent: incoming, path: '/v1/chat/completions' },
      ])
    } finally {
      await off.stop()
      process.env.OTEL_EXPORTER_OTLP_ENDPOINT = saved.endpoint
      process.env.OTEL_TRACES_EXPORTER = saved.exporter
      if (saved.endpoint === undefined) delete process.env.OTEL_EXPORTER_OTLP_ENDPOINT
      if (saved.exporter === undefined) delete process.env.OTEL_TRACES_EXPORTER
    }
    expect(quiet.requests).toEqual([])
    quiet.stop()
  })
})
