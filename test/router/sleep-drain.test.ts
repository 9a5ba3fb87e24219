import { afterAll, afterEach, beforeAll, describe, expect, it } from 'bun:test'
import type { RouterService } from '../../plugins/router/service.ts'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'
import {
  chat,
  engineHits,
  modelsYaml,
  startRouter,
  startRouterWithGateway,
  startSim,
  type TestRouter,
} from './support.ts'

/**
 * The router's sleeps never cut a request: a manual or automatic sleep drains the model first (the
 * router's own count for a configured endpoint, the gateway's leases for a gateway model), asks the
 * engine with mode=wait, gives up at the deadline with the model still serving, and gives way to a
 * request that arrives while it drains. A wake after level 2 runs vLLM's reload sequence.
 */
const MODEL = 'drain-model'

/** A streamed chat read to its end: content tokens, finish reason, error chunks, [DONE]. */
async function readChat(res: Response) {
  const text = await res.text()
  let tokens = 0
  let finish: string | null = null
  const errors: unknown[] = []
  for (const frame of text.split('\n\n')) {
    const data = frame.startsWith('data: ') ? frame.slice(6).trim() : ''
    if (!data || data === '[DONE]') continue
    const chunk = JSON.parse(data) as {
      error?: unknown
      choices?: { delta?: { content?: string }; finish_reason?: string | null }[]
    }
    if (chunk.error) errors.push(chunk.error)
    for (const c of chunk.choices ?? []) {
      if (c.delta?.content) tokens++
      if (c.finish_reason) finish = c.finish_reason
    }
  }
  return { tokens, finish, errors, done: text.trimEnd().endsWith('data: [DONE]') }
}

const stream = (url: string, maxTokens: number) =>
  fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(chat(MODEL, { stream: true, max_tokens: maxTokens, ignore_eos: true })),
  })

type Status = { models: Record<string, { status: string }> }
const stateOf = async (r: TestRouter) => (await r.get<Status>('/sleep/status')).body.models[MODEL]?.status

describe('router sleep of a configured endpoint', () => {
  let engine: EngineProc
  let r: TestRouter | null = null
  beforeAll(async () => {
    // 50 tokens/s: a 60-token stream lasts 1.2 s.
    engine = await startSim(MODEL, { tokensPerSec: 50, wakeDelayMs: 60 })
  })
  afterEach(async () => {
    await r?.stop()
    r = null
    // Every test leaves the engine awake for the next.
    if ((await (await fetch(`http://127.0.0.1:${engine.port}/is_sleeping`)).json()).is_sleeping)
      await fetch(`http://127.0.0.1:${engine.port}/wake_up`, { method: 'POST' })
  })
  afterAll(() => cleanupSims())

  /** sawLine: the engine's output (read through a pipe) has shown `line`. */
  const sawLine = (line: string) => waitFor(`the engine to log ${line}`, () => engine.stdout().includes(line))
  const boot = (o: { autoSleep?: string; extra?: string } = {}) =>
    startRouter(`
${modelsYaml([{ name: MODEL, port: engine.port }])}
auto_sleep: { min_sleep_duration: 0${o.autoSleep ? `, ${o.autoSleep}` : ''} }
wake_on_request: hold
${o.extra ?? ''}`)

  it('waits for the stream in flight, then sleeps the engine with mode=wait', async () => {
    r = await boot()
    const sleepsBefore = engineHits(engine, 'POST', '/sleep')
    const res = await stream(r.routerUrl, 60)
    expect(res.status).toBe(200)
    const action = r.post(`/action/sleep/${MODEL}`)
    const streamed = await readChat(res)
    expect(streamed).toEqual({ tokens: 60, finish: 'length', errors: [], done: true })
    const done = await action
    expect(done.status).toBe(200)
    expect(done.body).toMatchObject({ status: 'success', model: MODEL, message: 'Model put to sleep' })
    await sawLine('"POST /sleep?level=1&mode=wait HTTP/1.1" 200')
    expect(engineHits(engine, 'POST', '/sleep') - sleepsBefore).toBe(1)
    expect(await stateOf(r)).toBe('sleeping')
  })

  it('refuses at the deadline (control_timeout) and keeps serving; the stream is never cut', async () => {
    r = await boot({ extra: 'control_timeout: 1' })
    const sleepsBefore = engineHits(engine, 'POST', '/sleep')
    const res = await stream(r.routerUrl, 100) // 2 s
    expect(res.status).toBe(200)
    const refused = await r.post(`/action/sleep/${MODEL}`)
    expect(refused.status).toBe(409)
    expect(refused.body).toEqual({
      status: 'error',
      model: MODEL,
      message: 'Model still has 1 request(s) in flight after 1 s; it was not put to sleep and keeps serving',
    })
    const more = await r.post<{ choices: unknown[] }>('/v1/chat/completions', chat(MODEL))
    expect(more.status).toBe(200)
    expect(await readChat(res)).toEqual({ tokens: 100, finish: 'length', errors: [], done: true })
    expect(engineHits(engine, 'POST', '/sleep')).toBe(sleepsBefore)
    expect(await stateOf(r)).toBe('active')
  })

  it('gives way to a request that arrives while it drains: the model stays active and serves it', async () => {
    r = await boot()
    const sleepsBefore = engineHits(engine, 'POST', '/sleep')
    const res = await stream(r.routerUrl, 60)
    expect(res.status).toBe(200)
    const action = r.post<{ message: string }>(`/action/sleep/${MODEL}`)
    // The sleep is draining once the model takes no new request directly (they go to the wake path).
    const router = r.host.api<RouterService>('router')
    await waitFor('the sleep to start draining', () => router.table.get(MODEL)?.op === 'sleep')
    const late = await r.post<{ choices: unknown[] }>('/v1/chat/completions', chat(MODEL))
    expect(late.status).toBe(200)
    expect(late.body.choices).toHaveLength(1)
    const refused = await action
    expect(refused.status).toBe(409)
    expect(refused.body.message).toStartWith('A request arrived while the sleep waited for')
    expect(refused.body.message).toEndWith('the model keeps serving')
    expect(await readChat(res)).toEqual({ tokens: 60, finish: 'length', errors: [], done: true })
    expect(engineHits(engine, 'POST', '/sleep')).toBe(sleepsBefore)
    expect(await stateOf(r)).toBe('active')
  })

  it('auto-sleep spares a stream it cannot see (sent to the engine directly): mode=wait', async () => {
    r = await boot({ autoSleep: 'enabled: true, idle_threshold: 1, check_interval: 3600' })
    const res = await stream(`http://127.0.0.1:${engine.port}`, 60)
    expect(res.status).toBe(200)
    r.clock.advance(2000)
    r.host.api<RouterService>('router').sleep.tick()
    await waitFor('the idle model asleep', async () => (await stateOf(r!)) === 'sleeping', {
      timeoutMs: 5000,
    })
    expect(await readChat(res)).toEqual({ tokens: 60, finish: 'length', errors: [], done: true })
  })

  it('wakes a level-2 sleeper through reload_weights, in vLLM order', async () => {
    r = await boot({ autoSleep: 'level: 2' })
    const before = await r.post<{ choices: { message: { content: string } }[] }>(
      '/v1/chat/completions',
      chat(MODEL, { max_tokens: 8 }),
    )
    const slept = await r.post(`/action/sleep/${MODEL}`)
    expect(slept.status).toBe(200)
    await sawLine('"POST /sleep?level=2&mode=wait HTTP/1.1" 200')
    const mark = engine.stdout().length
    const woke = await r.post(`/action/wakeup/${MODEL}`)
    expect(woke.status).toBe(200)
    const calls = await waitFor('the wake calls in the engine log', () => {
      const lines = engine.stdout().slice(mark)
      const seen = [...lines.matchAll(/"POST (\/(?:wake_up|collective_rpc|reset_prefix_cache)\S*) HTTP/g)]
      return seen.length >= 4 ? seen.map((m) => m[1]) : undefined
    })
    expect(calls).toEqual([
      '/wake_up?tags=weights',
      '/collective_rpc',
      '/wake_up?tags=kv_cache',
      '/reset_prefix_cache',
    ])
    const after = await r.post<{ choices: { message: { content: string } }[] }>(
      '/v1/chat/completions',
      chat(MODEL, { max_tokens: 8 }),
    )
    expect(after.body.choices[0]!.message.content).toBe(before.body.choices[0]!.message.content)
  })
})

describe('router sleep of a gateway model', () => {
  let r: TestRouter & { simDir: string }
  let id = ''
  beforeAll(async () => {
    r = await startRouterWithGateway([18650, 18659], 'auto_sleep: { min_sleep_duration: 0 }')
    const load = await r.main<{ instance_id: string }>('/api/v1/models/load', {
      method: 'POST',
      body: JSON.stringify({
        model_path: 'org/drain-base',
        served_model_name: MODEL,
        enable_sleep_mode: true,
      }),
    })
    id = load.body.instance_id
    await waitFor(
      'the gateway instance routed',
      async () => (await r.get<Status>('/sleep/status')).body.models[MODEL]?.status === 'active',
      { timeoutMs: 20_000, wake: (n) => r.host.bus.on('gateway.instance.status', n) },
    )
  })
  afterAll(() => r?.stop())

  it("drains through the gateway's leases: the router's stream finishes, then the instance sleeps", async () => {
    // The gateway's simulated engines stream 200 tokens/s: 300 tokens last 1.5 s.
    const res = await stream(r.routerUrl, 300)
    expect(res.status).toBe(200)
    const action = r.post(`/action/sleep/${MODEL}`)
    expect(await readChat(res)).toEqual({ tokens: 300, finish: 'length', errors: [], done: true })
    const done = await action
    expect(done.status).toBe(200)
    const inst = await r.main<{ model: { status: string } }>(`/api/v1/models/${id}`)
    expect(inst.body.model.status).toBe('sleeping')
  })
})
