import { afterAll, afterEach, beforeAll, describe, expect, it } from 'bun:test'
import OpenAI from 'openai'
import {
  cleanupSims,
  type EngineProc,
  spawnEngine,
  sseFrames,
  tempSimDir,
  waitHealthy,
} from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'
import { FakeGateway, instance, type ProxyHost, postJson, startProxyHost } from './support.ts'

/** The proxy in front of the real engine simulator (a separate process speaking vLLM's HTTP API). */
const MODEL = 'Qwen/Qwen2.5-0.5B-Instruct'
const KEY = 'sk-proxy-test'

async function engine(env: Record<string, string> = {}): Promise<EngineProc> {
  const e = await spawnEngine(MODEL, [], {
    MODELGATE_SIM_DIR: tempSimDir(),
    SIM_TOKENS_PER_SEC: '100',
    ...env,
  })
  await waitHealthy(e)
  return e
}

describe('proxy in front of the engine simulator', () => {
  const api = new FakeGateway()
  let e: EngineProc
  let px: ProxyHost
  let client: OpenAI
  const auth = { authorization: `Bearer ${KEY}` }

  beforeAll(async () => {
    e = await engine()
    api.add(instance('qwen-1', e.port, { served_model_name: MODEL, model_path: MODEL }))
    px = await startProxyHost(api, { env: { INFERENCE_API_KEY: KEY } })
    client = new OpenAI({ baseURL: `${px.url}/v1`, apiKey: KEY, maxRetries: 0 })
  })
  afterAll(async () => {
    await px.stop()
    await cleanupSims()
  })

  it('serves a chat completion to the official openai client', async () => {
    const reply = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Say hello' }],
      max_tokens: 8,
    })
    expect(reply.object).toBe('chat.completion')
    expect(reply.choices[0]!.message.role).toBe('assistant')
    expect(reply.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(reply.usage!.completion_tokens).toBeGreaterThan(0)
  })

  it('serves a streamed chat completion to the official openai client, by instance id', async () => {
    const stream = await client.chat.completions.create({
      model: 'qwen-1',
      messages: [{ role: 'user', content: 'Count' }],
      max_tokens: 12,
      stream: true,
      stream_options: { include_usage: true },
    })
    let text = ''
    let chunks = 0
    let usage: unknown = null
    for await (const chunk of stream) {
      chunks++
      text += chunk.choices[0]?.delta.content ?? ''
      if (chunk.usage) usage = chunk.usage
    }
    expect(chunks).toBeGreaterThan(5)
    expect(text.length).toBeGreaterThan(0)
    expect(usage).toMatchObject({ completion_tokens: 12 })
    await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
  })

  it('lists the model once through the openai client, with its state and instance', async () => {
    const listed = []
    for await (const m of client.models.list()) listed.push(m as unknown as Record<string, unknown>)
    expect(listed.map((m) => [m.id, m.state, m.instance_id])).toEqual([[MODEL, 'active', 'qwen-1']])
  })

  it('passes the stream through frame for frame, as the engine sends it', async () => {
    const body = { model: MODEL, prompt: 'x', max_tokens: 10, ignore_eos: true, stream: true, temperature: 0 }
    const direct = await postJson(`http://127.0.0.1:${e.port}/v1/completions`, body)
    const directFrames = sseFrames(await direct.text())
    const res = await postJson(`${px.url}/v1/completions`, body, auth)
    expect(res.status).toBe(200)
    // Frames are counted in the bytes, not in network reads: how many reads a stream takes depends
    // on scheduling (a busy machine coalesces them); that each frame is handed on as the engine
    // sends it is test/wire/stream.test.ts's (lockstep, no timing).
    const text = await res.text()
    const proxied = sseFrames(text)
    // Nothing but whole `data:` frames, as many as the engine sends, ending with [DONE].
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true)
    expect(
      text
        .split('\n\n')
        .slice(0, -1)
        .every((f) => f.startsWith('data: ')),
    ).toBe(true)
    expect(proxied.length).toBe(directFrames.length)
    expect(proxied.at(-1)).toBe('[DONE]')
    const texts = (frames: string[]) =>
      frames.filter((f) => f !== '[DONE]').map((f) => JSON.parse(f).choices[0]?.text ?? '')
    expect(texts(proxied)).toEqual(texts(directFrames))
    expect(texts(proxied).filter((t) => t !== '').length).toBe(10)
  })

  it('passes an engine error through with its status and body', async () => {
    const body = { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 10_000_000 }
    const direct = await postJson(`http://127.0.0.1:${e.port}/v1/chat/completions`, body)
    const res = await postJson(`${px.url}/v1/chat/completions`, body, auth)
    expect(direct.status).toBeGreaterThanOrEqual(400)
    expect(res.status).toBe(direct.status)
    const [a, b] = [await direct.text(), await res.text()]
    expect(b.replace(/"id":"[^"]*"/g, '')).toBe(a.replace(/"id":"[^"]*"/g, ''))
  })

  it('stops the engine generating when the client goes away', async () => {
    const ac = new AbortController()
    const res = await fetch(`${px.url}/v1/chat/completions`, {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({
        model: MODEL,
        messages: [{ role: 'user', content: 'go on' }],
        max_tokens: 2000,
        ignore_eos: true,
        stream: true,
      }),
      signal: ac.signal,
    })
    const reader = res.body!.getReader()
    await reader.read()
    await reader.read()
    ac.abort()
    await e.waitForOutput(/Aborted request/, 3000)
    await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
    expect(px.events.at(-1)).toMatchObject({ status: 499, streamed: true })
  })

  it('serves the direct proxy to the engine port', async () => {
    const res = await fetch(`${px.url}/api/direct/${e.port}/v1/models`, { headers: auth })
    expect(res.status).toBe(200)
    expect(((await res.json()) as { data: { id: string }[] }).data[0]!.id).toBe(MODEL)
    const tok = await fetch(`${px.url}/tokenize`, {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({ model: MODEL, prompt: 'hello world' }),
    })
    expect(tok.status).toBe(200)
    expect(await tok.json()).toMatchObject({ count: expect.any(Number), tokens: expect.any(Array) })
  })
})

describe('proxy in front of an engine that dies mid-stream', () => {
  afterEach(cleanupSims)

  it('ends the client stream with an error event then [DONE], and releases the lease', async () => {
    const e = await engine({ SIM_CRASH_AFTER_TOKENS: '5' })
    const api = new FakeGateway()
    api.add(instance('crashy', e.port, { served_model_name: MODEL }))
    const px = await startProxyHost(api)
    try {
      const res = await postJson(`${px.url}/v1/chat/completions`, {
        model: 'crashy',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 50,
        ignore_eos: true,
        stream: true,
      })
      expect(res.status).toBe(200)
      const frames = sseFrames(await res.text())
      expect(frames.at(-1)).toBe('[DONE]')
      expect(JSON.parse(frames.at(-2)!)).toEqual({
        error: {
          message: expect.stringContaining('The model engine stopped before the response ended'),
          type: 'bad_gateway',
          code: 'upstream_disconnected',
        },
      })
      expect(frames.filter((f) => f.includes('chat.completion.chunk')).length).toBeGreaterThan(0)
      expect(await e.exited).toBe(1)
      await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
      expect(api.doubleReleases).toBe(0)
      expect(px.events.at(-1)).toMatchObject({ status: 502, streamed: true })
      // The next request finds the engine gone: 502 in the proxy shape, not a hang.
      const after = await postJson(`${px.url}/v1/chat/completions`, { model: 'crashy', messages: [] })
      expect(after.status).toBe(502)
    } finally {
      await px.stop()
    }
  })
})
