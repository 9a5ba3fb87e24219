import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { traceparentsSeen } from '../../src/sim/traces.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { childrenOf, OtlpReceiver, type ReceivedSpan } from '../support/otlp-receiver.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Admin operations as traces, on a real gateway driving simulated engines, exported by the real
 * OTLP exporter to a receiver at the process boundary: a load with its start-up phases, a sleep, a
 * level-2 wake with vLLM's phases, a move with the target's load inside it, a preset apply with its
 * unloads and loads; and what was queued when the host stopped arrives (the exporter is flushed).
 */
let receiver: OtlpReceiver
let gw: TestGateway

beforeAll(async () => {
  receiver = new OtlpReceiver()
  gw = await startGateway({
    ports: [23500, 23509],
    env: { SIM_WAKE_DELAY_MS: '60', SIM_LOAD_DELAY_MS: '200' },
    extraYaml: `telemetry: { otlp_endpoint: '${receiver.url}', service_name: gw-test, engine_otlp_traces_endpoint: 'http://127.0.0.1:4317' }\n`,
  })
})
afterAll(async () => {
  await gw?.stop()
  receiver.stop()
})

const root = (name: string, attr: string, value: unknown) =>
  receiver.spans.find((s) => s.name === name && s.parentSpanId === '' && s.attributes[attr] === value)

function names(spans: ReceivedSpan[]): string[] {
  return spans.map((s) => s.name)
}

async function traceOf(
  name: string,
  attr: string,
  value: unknown,
): Promise<{ root: ReceivedSpan; spans: ReceivedSpan[] }> {
  await receiver.waitForSpans(
    () => root(name, attr, value) !== undefined,
    `the ${name} span of ${String(value)}`,
  )
  const r = root(name, attr, value)!
  return { root: r, spans: receiver.trace(r.traceId) }
}

describe('admin operation traces', () => {
  let id = ''

  it('traces a load: place, spawn, the engine start-up phases, ready; engines get the OTLP endpoint', async () => {
    id = await gw.load({ model_path: 'Qwen/Qwen2.5-0.5B', enable_sleep_mode: true, gpu_ids: [0] })
    const model = await gw.waitStatus(id, 'active')
    expect(String(model.launch_command)).toContain('--otlp-traces-endpoint http://127.0.0.1:4317')
    const { root: load, spans } = await traceOf('gateway.load', 'modelgate.instance_id', id)
    expect(load.attributes).toMatchObject({
      'gen_ai.request.model': 'Qwen/Qwen2.5-0.5B',
      'modelgate.gpu_ids': '0',
      'modelgate.outcome': 'active',
    })
    expect(load.status.code).toBe(0)
    expect(load.resource['service.name']).toBe('gw-test')
    const phases = names(childrenOf(spans, load))
    expect(phases.slice(0, 2)).toEqual(['load.place', 'load.spawn'])
    expect(phases.at(-1)).toBe('load.ready')
    for (const p of ['load.loading_weights', 'load.kv_cache']) expect(phases).toContain(p)
    // Phases follow each other: each starts no earlier than the one before ends.
    const kids = childrenOf(spans, load)
    for (let i = 1; i < kids.length; i++) expect(kids[i]!.start).toBeGreaterThanOrEqual(kids[i - 1]!.end - 1)
  })

  it('traces a sleep and a level-2 wake with each engine phase', async () => {
    const slept = await gw.json(`/api/models/instances/${id}/sleep?level=2`, { method: 'POST' })
    expect(slept.status).toBe(200)
    const woke = await gw.json<{ phases: string[] }>(`/api/models/instances/${id}/wake`, {
      method: 'POST',
      body: '{}',
    })
    expect(woke.status).toBe(200)
    const sleep = await traceOf('gateway.sleep', 'modelgate.instance_id', id)
    expect(sleep.root.attributes['modelgate.sleep.level']).toBe(2)
    expect(names(childrenOf(sleep.spans, sleep.root))).toEqual([
      'sleep.drain',
      'sleep.measure_awake',
      'sleep.engine',
      'sleep.verify',
    ])
    const wake = await traceOf('gateway.wake', 'modelgate.instance_id', id)
    expect(wake.root.traceId).not.toBe(sleep.root.traceId)
    expect(names(childrenOf(wake.spans, wake.root))).toEqual(woke.body.phases.map((p) => `wake.${p}`))
    expect(woke.body.phases.length).toBeGreaterThanOrEqual(3)
  })

  it('traces a move: its phases, and the target load inside the same trace', async () => {
    const res = await gw.json<{ move_id: string }>(`/api/models/instances/${id}/move`, {
      method: 'POST',
      body: JSON.stringify({ target_gpu_ids: [1] }),
    })
    expect(res.status).toBe(202)
    const move = await traceOf('gateway.move', 'modelgate.move_id', res.body.move_id)
    expect(move.root.attributes['modelgate.outcome']).toBe('completed')
    const kids = names(childrenOf(move.spans, move.root))
    for (const p of [
      'move.validating',
      'move.spawning',
      'move.switching',
      'move.draining',
      'move.completing',
    ])
      expect(kids).toContain(p)
    const targetLoad = move.spans.find((s) => s.name === 'gateway.load')!
    expect(targetLoad.parentSpanId).toBe(move.root.spanId)
    expect(targetLoad.attributes['modelgate.gpu_ids']).toBe('1')
    id = String(targetLoad.attributes['modelgate.instance_id'])
  })

  it('traces a preset apply: the unloads, then each entry loaded under it', async () => {
    const saved = await gw.json<{ configuration: { id: string } }>('/api/configurations', {
      method: 'POST',
      body: JSON.stringify({ name: 'traced' }),
    })
    expect(saved.status).toBe(201)
    const presetId = saved.body.configuration.id
    expect((await gw.json(`/api/configurations/${presetId}/load`, { method: 'POST' })).status).toBe(202)
    const apply = await traceOf('gateway.preset.apply', 'modelgate.preset_id', presetId)
    expect(apply.root.status.code).toBe(0)
    expect(apply.root.attributes).toMatchObject({
      'modelgate.preset.loaded': 1,
      'modelgate.preset.failed': 0,
    })
    expect(names(childrenOf(apply.spans, apply.root))).toEqual(['preset.unload_all', 'gateway.load'])
    const load = apply.spans.find((s) => s.name === 'gateway.load')!
    expect(names(childrenOf(apply.spans, load))).toContain('load.ready')
    id = String(load.attributes['modelgate.instance_id'])
  })

  it('records the traceparent an engine receives (the simulator, for the request path)', async () => {
    const model = await gw.waitStatus(id, 'active')
    const port = Number(model.port)
    const tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
    const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', traceparent: tp },
      body: JSON.stringify({ model: 'Qwen/Qwen2.5-0.5B', prompt: 'hi', max_tokens: 2 }),
    })
    expect(res.status).toBe(200)
    await res.text()
    expect(traceparentsSeen(gw.simDir, port)).toEqual([{ traceparent: tp, path: '/v1/completions' }])
  })

  it('sends at shutdown what is still queued', async () => {
    // A sleep ends right before the host stops, inside the exporter's 1 s batch delay (the unit test
    // in telemetry.test.ts shows the same without any timing), and its span still arrives.
    const slept = await gw.json(`/api/models/instances/${id}/sleep?level=1`, { method: 'POST' })
    expect(slept.status).toBe(200)
    await gw.stop()
    await waitFor('the last sleep span', () => root('gateway.sleep', 'modelgate.instance_id', id), {
      timeoutMs: 1000,
    })
  })
})
