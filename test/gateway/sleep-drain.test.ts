import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * A sleep asked of the gateway never cuts a request: vLLM's /sleep aborts what runs on the engine
 * (mode defaults to abort), so the gateway stops routing to the instance, lets its in-flight
 * requests finish (up to plugins.gateway.sleep.drain_timeout_ms) and only then asks the engine to
 * sleep, with mode=wait. Past the deadline the sleep is refused and the instance keeps serving.
 */
const MODEL = 'Qwen/Qwen2.5-7B-Instruct'

type SleepStatus = {
  status: string
  operation: string | null
  in_flight: number
  engine_is_sleeping: boolean
}
type ErrorBody = { error: { code: string; message: string; statusCode: number } }

/** A streamed chat read to its end: its content tokens, finish reason, usage and any error chunk. */
interface Streamed {
  tokens: number
  finish: string | null
  completionTokens: number | null
  errors: unknown[]
  done: boolean
}

async function readChat(res: Response): Promise<Streamed> {
  const text = await res.text()
  const out: Streamed = { tokens: 0, finish: null, completionTokens: null, errors: [], done: false }
  for (const frame of text.split('\n\n')) {
    const data = frame.startsWith('data: ') ? frame.slice(6).trim() : ''
    if (!data) continue
    if (data === '[DONE]') {
      out.done = true
      continue
    }
    const chunk = JSON.parse(data) as {
      error?: unknown
      choices?: { delta?: { content?: string }; finish_reason?: string | null }[]
      usage?: { completion_tokens: number } | null
    }
    if (chunk.error) out.errors.push(chunk.error)
    for (const c of chunk.choices ?? []) {
      if (c.delta?.content) out.tokens++
      if (c.finish_reason) out.finish = c.finish_reason
    }
    if (chunk.usage) out.completionTokens = chunk.usage.completion_tokens
  }
  return out
}

describe('gateway sleep drains in-flight requests first', () => {
  let gw: TestGateway
  let id = ''
  beforeAll(async () => {
    gw = await startGateway({
      ports: [18600, 18619],
      // 50 tokens/s: a 40-token stream lasts 0.8 s, long enough to ask for a sleep in the middle.
      env: { SIM_TOKENS_PER_SEC: '50', SIM_WAKE_DELAY_MS: '60' },
      extraYaml: '    sleep: { drain_timeout_ms: 20000, verify_fallback: warn }\n',
    })
    id = await gw.load({ model_path: MODEL, gpu_ids: [1], enable_sleep_mode: true })
    await gw.waitStatus(id, 'active')
  })
  afterAll(() => gw.stop())

  const stream = (maxTokens: number) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: MODEL,
        messages: [{ role: 'user', content: 'tell me a long story' }],
        max_tokens: maxTokens,
        ignore_eos: true,
        stream: true,
        stream_options: { include_usage: true },
      }),
    })
  const sleepStatus = async () =>
    (await gw.json<SleepStatus>(`/api/models/instances/${id}/sleep-status`)).body
  const lifecycle = (notify: () => void) => gw.host.bus.on('gateway.instance.lifecycle', notify)
  /**
   * awake: the instance serving again. The request refused while the sleep drained started a wake
   * on request (the gateway's /v1 wakes what it serves); without one, the test wakes it.
   */
  const awake = () =>
    waitFor(
      'the instance awake again',
      async () => {
        const s = await sleepStatus()
        if (s.status === 'sleeping' && s.operation === null)
          await gw.json(`/api/models/instances/${id}/wake`, { method: 'POST' })
        return s.status === 'active' && s.operation === null
      },
      { wake: lifecycle },
    )
  const engineLog = async () =>
    (await gw.json<{ logs: string }>(`/api/v1/models/instances/${id}/logs?lines=500`)).body.logs

  it('lets a stream in flight finish in full, then puts the engine to sleep (mode=wait)', async () => {
    const res = await stream(40)
    expect(res.status).toBe(200)
    const sleeping = gw.json<Record<string, unknown>>(`/api/models/instances/${id}/sleep?level=1`, {
      method: 'POST',
    })
    // The sleep waits: routing to the instance is off, the stream still holds it.
    const draining = await waitFor(
      'the sleep to drain the stream',
      async () => {
        const s = await sleepStatus()
        return s.operation === 'sleep' && s.in_flight === 1 ? s : undefined
      },
      { wake: lifecycle },
    )
    expect(draining).toMatchObject({ status: 'active', engine_is_sleeping: false })
    const refused = await gw.json<ErrorBody & { error: { code: string } }>('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    })
    expect(refused.status).toBe(503)
    expect(refused.body.error.code).toBe('model_sleeping')

    const streamed = await readChat(res)
    expect(streamed).toEqual({ tokens: 40, finish: 'length', completionTokens: 40, errors: [], done: true })
    const slept = await sleeping
    expect(slept.status).toBe(200)
    expect(slept.body).toMatchObject({
      status: 'sleeping',
      instance_id: id,
      sleep_level: 1,
      drained_requests: 1,
      mode: 'wait',
    })
    expect(slept.body.drain_ms as number).toBeGreaterThan(0)
    // The engine's log reaches the gateway through a pipe: wait for the line rather than read at once.
    await waitFor('the sleep with mode=wait in the engine log', async () =>
      (await engineLog()).includes('"POST /sleep?level=1&mode=wait HTTP/1.1" 200'),
    )
    await awake()
  })

  it('refuses the sleep at the drain deadline and keeps serving; the stream is never cut', async () => {
    const res = await stream(60)
    expect(res.status).toBe(200)
    const sleepsBefore = (await engineLog()).split('"POST /sleep').length
    const refused = await gw.json<ErrorBody>(
      `/api/models/instances/${id}/sleep?level=1&drain_timeout_ms=200`,
      { method: 'POST' },
    )
    expect(refused.status).toBe(409)
    expect(refused.body.error.code).toBe('SLEEP_DRAIN_TIMEOUT')
    expect(refused.body.error.message).toBe(
      `Instance ${id} still has 1 request(s) in flight after 200 ms; it was not put to sleep and keeps serving`,
    )
    // Routing is back on at once: a new request is served while the first stream goes on.
    const more = await gw.json<{ choices: unknown[] }>('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    })
    expect(more.status).toBe(200)
    expect(more.body.choices).toHaveLength(1)
    // drain_timeout_ms=0: no waiting at all while a request is open.
    const now = await gw.json<ErrorBody>(`/api/models/instances/${id}/sleep?drain_timeout_ms=0`, {
      method: 'POST',
    })
    expect(now.status).toBe(409)
    expect(now.body.error.code).toBe('SLEEP_DRAIN_TIMEOUT')

    const streamed = await readChat(res)
    expect(streamed).toEqual({ tokens: 60, finish: 'length', completionTokens: 60, errors: [], done: true })
    expect(await sleepStatus()).toMatchObject({
      status: 'active',
      engine_is_sleeping: false,
      operation: null,
      in_flight: 0,
    })
    expect((await engineLog()).split('"POST /sleep').length).toBe(sleepsBefore)
  })

  it('answers 400 in the controller shape for a bad drain_timeout_ms', async () => {
    for (const bad of ['-1', 'soon', '1.5']) {
      const r = await gw.json<ErrorBody>(`/api/models/instances/${id}/sleep?drain_timeout_ms=${bad}`, {
        method: 'POST',
      })
      expect(r.status).toBe(400)
      expect(r.body.error.code).toBe('VALIDATION_ERROR')
      expect(r.body.error.message).toContain('drain_timeout_ms')
    }
    expect((await sleepStatus()).status).toBe('active')
  })
})
