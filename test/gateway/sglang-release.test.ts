import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { groupGone, startGateway, type TestGateway } from '../support/gateway.ts'
import { freePortRange } from '../support/ports.ts'

/**
 * How the gateway sleeps an SGLang engine as current SGLang behaves (a simulated `sim sglang` behind
 * a real gateway): its release asserts that no queue of the scheduler holds a request (a release
 * under load kills the engine), it answers before its memory is given back (here 1.5 s later, what
 * nvidia-smi shows), and a level-2 sleep treats the weights as discarded, so its wake reloads them.
 * A sleep that freed too little unloads the engine (verify_fallback: unload), so a sleep check that
 * judged the first reading would unload a healthy one.
 */
const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
const SERVED = 'qwen-release'
const PORT = freePortRange(10)
type Json = Record<string, unknown>

let gw: TestGateway
let id = ''
let enginePort = 0

const instance = async () => (await gw.json<{ model: Json }>(`/api/v1/models/${id}`)).body.model
const logs = async () =>
  (await gw.json<{ logs: string }>(`/api/v1/models/instances/${id}/logs?lines=500`)).body.logs
const post = (path: string, body?: unknown) =>
  gw.json<Json>(path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
const engine = (path: string, body: unknown) =>
  fetch(`http://127.0.0.1:${enginePort}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  })

beforeAll(async () => {
  gw = await startGateway({
    ports: [PORT, PORT + 9],
    env: { SIM_SGLANG_RELEASE_LAG_MS: '1500', SIM_WAKE_DELAY_MS: '60' },
    extraYaml: '    sleep: { verify_fallback: unload, verify_wait_ms: 20000 }\n',
  })
  id = await gw.load({
    model_path: MODEL,
    served_model_name: SERVED,
    engine_kind: 'sglang',
    gpu_ids: [0],
    gpu_memory_utilization: 0.5,
    enable_sleep_mode: true,
  })
  const rec = await gw.waitStatus(id, 'active')
  enginePort = rec.port as number
}, 30_000)

afterAll(() => gw?.stop())

describe('an SGLang sleep', () => {
  it('is refused while a request sits in a paused scheduler, which then completes on the live engine', async () => {
    // A request reaches the engine past the gateway, starts, and the scheduler is paused under it:
    // /metrics then counts it neither running nor queued, /get_load counts it paused.
    const res = await engine('/v1/chat/completions', {
      model: SERVED,
      messages: [{ role: 'user', content: 'count' }],
      max_tokens: 30,
      stream: true,
    })
    const reader = res.body!.getReader()
    const decoder = new TextDecoder()
    let text = decoder.decode((await reader.read()).value)
    expect((await engine('/pause_generation', { mode: 'in_place' })).status).toBe(200)
    const load = (await (await fetch(`http://127.0.0.1:${enginePort}/get_load`)).json()) as Json[]
    expect(load[0]!.num_paused_reqs).toBe(1)

    const refused = await post(`/api/models/instances/${id}/sleep`)
    expect(refused.status).toBe(502)
    expect((refused.body.error as Json).message).toContain('running, queued or paused')
    expect(await logs()).not.toContain('release_memory_occupation')
    expect((await instance()).status).toBe('active')

    expect((await engine('/continue_generation', {})).status).toBe(200)
    for (;;) {
      const { value, done } = await reader.read()
      if (done) break
      text += decoder.decode(value)
    }
    const frames = text.split('\n\n').filter((f) => f.startsWith('data: '))
    expect(frames.at(-1)).toBe('data: [DONE]')
    expect(frames.filter((f) => /"content":"[^"]/.test(f)).length).toBe(30)
    expect(groupGone((await instance()).process_id as number)).toBe(false)
  }, 30_000)

  it('is verified once nvidia-smi shows the memory its release gave back late, not unloaded', async () => {
    const slept = await post(`/api/models/instances/${id}/sleep`)
    expect(slept.status).toBe(200)
    expect(slept.body).toMatchObject({
      status: 'sleeping',
      sleep_level: 1,
      sleep_verified: true,
      fallback: null,
    })
    expect((await instance()).status).toBe('sleeping')
    const woke = await post(`/api/models/instances/${id}/wake`)
    expect(woke.status).toBe(200)
    expect(woke.body).toMatchObject({ status: 'running', sleep_level: 1, phases: ['resume'] })
  }, 30_000)

  it('sleeps at level 2 and wakes by resuming the memory, then reloading the weights from disk', async () => {
    const slept = await post(`/api/models/instances/${id}/sleep?level=2`)
    expect(slept.status).toBe(200)
    expect(slept.body).toMatchObject({ status: 'sleeping', sleep_level: 2, sleep_verified: true })
    const woke = await post(`/api/models/instances/${id}/wake`)
    expect(woke.status).toBe(200)
    expect(woke.body).toMatchObject({
      status: 'running',
      sleep_level: 2,
      phases: ['resume', 'reload_weights'],
    })
    const after = (await logs()).split('POST /release_memory_occupation HTTP/1.1" 200').at(-1) ?? ''
    expect(
      after.match(/POST \/(resume_memory_occupation|update_weights_from_disk) HTTP\/1\.1" 200/g),
    ).toEqual([
      'POST /resume_memory_occupation HTTP/1.1" 200',
      'POST /update_weights_from_disk HTTP/1.1" 200',
    ])
    const chat = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: SERVED, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    })
    expect(chat.status).toBe(200)
    expect((await instance()).status).toBe('active')
  }, 30_000)
})
