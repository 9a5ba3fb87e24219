import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { Value } from '@sinclair/typebox/value'
import { RootConfigSchema } from '../../src/config/schema.ts'
import { Logger } from '../../src/host/logger.ts'
import { NOOP_SPAN, PhaseSpans } from '../../src/host/telemetry/spans.ts'
import { Telemetry, type TelemetryConfig } from '../../src/host/telemetry/telemetry.ts'
import { formatTraceparent, parseTraceparent } from '../../src/host/telemetry/traceparent.ts'
import { childrenOf, OtlpReceiver } from '../support/otlp-receiver.ts'

/**
 * Telemetry through the real OpenTelemetry SDK and OTLP/HTTP exporter, to a receiver at the process
 * boundary: what is exported, in which trace, under which parent; sampling; an incoming traceparent;
 * the flush at shutdown.
 */
const log = new Logger('error', 'test', 'text', () => {})

function config(over: Partial<TelemetryConfig>): TelemetryConfig {
  const root = Value.Default(RootConfigSchema, { telemetry: { ...over } }) as { telemetry: TelemetryConfig }
  return root.telemetry
}

let receiver: OtlpReceiver
beforeAll(() => {
  receiver = new OtlpReceiver()
})
afterAll(() => receiver.stop())

describe('traceparent', () => {
  it('reads a valid header and refuses malformed ones', () => {
    const tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
    expect(parseTraceparent(tp)).toEqual({
      traceId: '0af7651916cd43dd8448eb211c80319c',
      spanId: 'b7ad6b7169203331',
      flags: 1,
    })
    expect(formatTraceparent('0af7651916cd43dd8448eb211c80319c', 'b7ad6b7169203331', 1)).toBe(tp)
    for (const bad of [
      '',
      null,
      'garbage',
      '00-00000000000000000000000000000000-b7ad6b7169203331-01',
      '00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01',
      'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
      '00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01',
      '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra',
      '00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
    ])
      expect(parseTraceparent(bad)).toBeNull()
    // A later version may carry more fields after its first four.
    expect(parseTraceparent('01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-future')?.flags).toBe(0)
  })
})

describe('telemetry off', () => {
  it('loads nothing, makes no request span and hands admin code the no-op span', async () => {
    const t = await Telemetry.start(config({}), { version: 't', log })
    expect(t).toBe(Telemetry.OFF)
    expect(t.enabled).toBe(false)
    expect(t.requestSpan({ method: 'POST', route: '/v1/chat/completions' })).toBeNull()
    expect(t.operation('gateway.load')).toBe(NOOP_SPAN)
    expect(NOOP_SPAN.child('x')).toBe(NOOP_SPAN)
    expect(t.engineTracesEndpoint()).toBeNull()
    await t.shutdown()
  })

  it('still gives engines their endpoint when only that is set', async () => {
    const t = await Telemetry.start(config({ engine_otlp_traces_endpoint: 'http://collector:4317' }), {
      version: 't',
      log,
    })
    expect(t.enabled).toBe(false)
    expect(t.engineTracesEndpoint()).toBe('http://collector:4317')
  })
})

describe('telemetry on', () => {
  it('exports one trace per request, children under their parents, and flushes at shutdown', async () => {
    const t = await Telemetry.start(
      config({ otlp_endpoint: receiver.url, service_name: 'mg-test', headers: { 'x-tenant': 'blue' } }),
      { version: '9.9.9', log },
    )
    expect(t.enabled).toBe(true)
    const req = t.requestSpan({
      method: 'POST',
      route: '/v1/chat/completions',
      model: 'qwen',
      clientAddress: '127.0.0.1',
    })!
    const held = req.child('modelgate.hold', { 'gen_ai.request.model': 'qwen' })
    const wake = t.operation('gateway.wake', { 'modelgate.instance_id': 'i-1' }, held)
    const phases = new PhaseSpans(wake)
    phases.enter('wake.weights')
    phases.enter('wake.kv_cache')
    phases.end()
    wake.end()
    held.end()
    const engine = req.child('engine.call', { 'server.port': 8100 }, { kind: 'client' })
    const forwarded = engine.inject()
    req.firstToken()
    engine.end()
    req.usage({ inputTokens: 12, outputTokens: 34, finishReasons: ['stop'] })
    req.end(200)
    const traceId = req.traceId
    // No wait for the batch delay: shutdown must send what is queued.
    await t.shutdown()
    const spans = receiver.trace(traceId)
    expect(spans.map((s) => s.name).sort()).toEqual(
      [
        'POST /v1/chat/completions',
        'engine.call',
        'gateway.wake',
        'modelgate.hold',
        'wake.kv_cache',
        'wake.weights',
      ].sort(),
    )
    const root = spans.find((s) => s.name === 'POST /v1/chat/completions')!
    expect(root.parentSpanId).toBe('')
    expect(root.kind).toBe(2) // SERVER in OTLP's enum
    expect(root.attributes).toMatchObject({
      'http.request.method': 'POST',
      'http.route': '/v1/chat/completions',
      'http.response.status_code': 200,
      'gen_ai.operation.name': 'chat',
      'gen_ai.request.model': 'qwen',
      'gen_ai.usage.input_tokens': 12,
      'gen_ai.usage.output_tokens': 34,
      'gen_ai.response.finish_reasons': ['stop'],
    })
    expect(root.attributes['gen_ai.server.time_to_first_token']).toBeGreaterThanOrEqual(0)
    expect(root.events.map((e) => e.name)).toContain('gen_ai.first_token')
    expect(root.resource).toMatchObject({ 'service.name': 'mg-test', 'service.version': '9.9.9' })
    expect(childrenOf(spans, root).map((s) => s.name)).toEqual(['modelgate.hold', 'engine.call'])
    const hold = spans.find((s) => s.name === 'modelgate.hold')!
    const wakeSpan = spans.find((s) => s.name === 'gateway.wake')!
    expect(wakeSpan.parentSpanId).toBe(hold.spanId)
    expect(childrenOf(spans, wakeSpan).map((s) => s.name)).toEqual(['wake.weights', 'wake.kv_cache'])
    const call = spans.find((s) => s.name === 'engine.call')!
    expect(call.kind).toBe(3) // CLIENT
    expect(forwarded).toBe(formatTraceparent(traceId, call.spanId, 1))
    expect(receiver.requests.at(-1)?.headers.get('x-tenant')).toBe('blue')
  })

  it('joins the trace of an incoming traceparent and follows its sampled flag', async () => {
    const t = await Telemetry.start(config({ otlp_endpoint: receiver.url, sample_ratio: 0 }), {
      version: 't',
      log,
    })
    const sampled = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
    const unsampled = '00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00'
    const joined = t.requestSpan({ method: 'POST', route: '/v1/completions', traceparent: sampled })!
    joined.child('engine.call').end()
    joined.end(503)
    const dropped = t.requestSpan({ method: 'POST', route: '/v1/completions', traceparent: unsampled })!
    // Not sampled, yet the context still travels on, marked not sampled.
    expect(dropped.inject()).toMatch(/^00-5bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-00$/)
    dropped.end(200)
    const own = t.requestSpan({ method: 'POST', route: '/v1/completions' })!
    own.end(200)
    const op = t.operation('gateway.sleep', { 'modelgate.instance_id': 'i-2' })
    op.end('engine refused')
    await t.shutdown()
    const joinedSpans = receiver.trace('4bf92f3577b34da6a3ce929d0e0e4736')
    const server = joinedSpans.find((s) => s.name === 'POST /v1/completions')!
    expect(server.parentSpanId).toBe('00f067aa0ba902b7')
    expect(server.status.code).toBe(2) // ERROR: a 503
    expect(childrenOf(joinedSpans, server).map((s) => s.name)).toEqual(['engine.call'])
    expect(receiver.trace('5bf92f3577b34da6a3ce929d0e0e4736')).toEqual([])
    // sample_ratio 0: a request that starts its trace is not sampled; admin operations always are.
    expect(receiver.trace(own.traceId)).toEqual([])
    const sleep = receiver.trace(op.traceId)
    expect(sleep.map((s) => s.name)).toEqual(['gateway.sleep'])
    expect(sleep[0]!.status).toEqual({ code: 2, message: 'engine refused' })
  })

  it('samples about sample_ratio of the requests that start a trace', async () => {
    const t = await Telemetry.start(config({ otlp_endpoint: receiver.url, sample_ratio: 0.25 }), {
      version: 't',
      log,
    })
    const ids: string[] = []
    for (let i = 0; i < 400; i++) {
      const r = t.requestSpan({ method: 'POST', route: '/v1/embeddings' })!
      ids.push(r.traceId)
      r.end(200)
    }
    await t.shutdown()
    const got = new Set(receiver.named('POST /v1/embeddings').map((s) => s.traceId))
    const kept = ids.filter((id) => got.has(id)).length
    // Ratio sampling decides by trace id: 100 expected, far outside 50..150 only by a broken sampler.
    expect(kept).toBeGreaterThan(50)
    expect(kept).toBeLessThan(150)
  })

  it('logs, and does not throw, when the collector is unreachable', async () => {
    const lines: string[] = []
    const t = await Telemetry.start(config({ otlp_endpoint: 'http://127.0.0.1:1', export_timeout_ms: 500 }), {
      version: 't',
      log: new Logger('warn', 'test', 'text', (l) => lines.push(l)),
    })
    t.operation('gateway.load').end()
    await t.shutdown()
    expect(lines.join('\n')).toContain('trace export failed')
  })
})
