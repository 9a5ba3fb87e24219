import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import {
  cleanupSims,
  type EngineProc,
  postJson,
  spawnEngine,
  sseFrames,
  tempSimDir,
  waitHealthy,
} from './helpers.ts'

const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
const TPS = 100
let e: EngineProc
const url = (path: string) => `http://127.0.0.1:${e.port}${path}`
const messages = [{ role: 'user', content: 'tell me about the river and the mountain' }]

beforeAll(async () => {
  e = await spawnEngine(MODEL, ['--served-model-name', 'qwen', 'qwen-alias', '--max-model-len', '8192'], {
    MODELGATE_SIM_DIR: tempSimDir(),
    SIM_TOKENS_PER_SEC: String(TPS),
    SIM_VLLM_VERSION: '0.11.0',
  })
  await waitHealthy(e)
})

afterAll(cleanupSims)

async function metric(name: string): Promise<number> {
  const text = await (await fetch(url('/metrics'))).text()
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`))
  return Number(line?.split(' ').pop())
}

describe('sim engine OpenAI API', () => {
  it('lists every served name with the context length, and reports its version', async () => {
    const models = await (await fetch(url('/v1/models'))).json()
    expect(models.object).toBe('list')
    expect(models.data).toHaveLength(2)
    for (const [i, id] of ['qwen', 'qwen-alias'].entries())
      expect(models.data[i]).toMatchObject({
        id,
        object: 'model',
        owned_by: 'vllm',
        root: MODEL,
        parent: null,
        max_model_len: 8192,
      })
    expect(await (await fetch(url('/version'))).json()).toEqual({ version: '0.11.0' })
  })

  it('answers a non-stream chat with usage whose prompt count matches /tokenize', async () => {
    const res = await postJson(e.port, '/v1/chat/completions', {
      model: 'qwen-alias',
      messages,
      max_tokens: 5,
      ignore_eos: true,
    })
    expect(res.status).toBe(200)
    const body = await res.json()
    expect(body.object).toBe('chat.completion')
    expect(body.id).toMatch(/^chatcmpl-[0-9a-f]{32}$/)
    expect(body.model).toBe('qwen-alias')
    expect(body.choices[0].message.role).toBe('assistant')
    expect(body.choices[0].message.content.split(' ')).toHaveLength(5)
    expect(body.choices[0].finish_reason).toBe('length')
    const tok = await (await postJson(e.port, '/tokenize', { model: 'qwen', messages })).json()
    expect(tok.max_model_len).toBe(8192)
    expect(tok.count).toBe(tok.tokens.length)
    expect(body.usage).toMatchObject({
      prompt_tokens: tok.count,
      completion_tokens: 5,
      total_tokens: tok.count + 5,
    })
  })

  it('streams a chat as role chunk, one chunk per token, usage chunk and [DONE] at the configured rate', async () => {
    const n = 40
    const res = await postJson(e.port, '/v1/chat/completions', {
      model: 'qwen',
      messages,
      max_tokens: n,
      ignore_eos: true,
      stream: true,
      stream_options: { include_usage: true },
    })
    expect(res.headers.get('content-type')).toContain('text/event-stream')
    const times: number[] = []
    let body = ''
    const decoder = new TextDecoder()
    for await (const chunk of res.body as ReadableStream<Uint8Array>) {
      const text = decoder.decode(chunk, { stream: true })
      body += text
      for (const _ of text.matchAll(/"content":"[^"]/g)) times.push(performance.now())
    }
    const frames = sseFrames(body)
    expect(frames.at(-1)).toBe('[DONE]')
    const chunks = frames.slice(0, -1).map((f) => JSON.parse(f))
    expect(chunks[0].choices[0].delta).toEqual({ role: 'assistant', content: '' })
    const content = chunks.filter((c) => c.choices.length > 0 && c.choices[0].delta.content)
    expect(content).toHaveLength(n)
    expect(chunks.every((c) => c.object === 'chat.completion.chunk' && c.id === chunks[0].id)).toBe(true)
    expect(content.at(-1).choices[0].finish_reason).toBe('length')
    expect(content.slice(0, -1).every((c) => c.choices[0].finish_reason === null)).toBe(true)
    const usage = chunks.at(-1)
    expect(usage.choices).toEqual([])
    expect(usage.usage.completion_tokens).toBe(n)
    // How close the pace is to TPS is a figure (a busy machine moves it): printed, not asserted.
    const rate = (times.length - 1) / (((times.at(-1) ?? 0) - (times[0] ?? 0)) / 1000)
    console.log(`simulator stream: ${rate.toFixed(0)} tokens/s measured, ${TPS} configured`)
  })

  it('stops at a deterministic pseudo-EOS without ignore_eos', async () => {
    const ask = async () =>
      (await (
        await postJson(e.port, '/v1/chat/completions', { model: 'qwen', messages, max_tokens: 4000 })
      ).json()) as {
        usage: { completion_tokens: number }
        choices: { finish_reason: string }[]
      }
    const [a, b] = await Promise.all([ask(), ask()])
    expect(a.choices[0]?.finish_reason).toBe('stop')
    expect(a.usage.completion_tokens).toBeGreaterThanOrEqual(1)
    expect(a.usage.completion_tokens).toBeLessThan(4000)
    expect(b.usage.completion_tokens).toBe(a.usage.completion_tokens)
  }, 10_000)

  it('serves /v1/completions (default 16 tokens) and streams text_completion chunks', async () => {
    const plain = await (
      await postJson(e.port, '/v1/completions', { model: 'qwen', prompt: 'the cache', ignore_eos: true })
    ).json()
    expect(plain.object).toBe('text_completion')
    expect(plain.id).toMatch(/^cmpl-/)
    expect(plain.usage).toMatchObject({ prompt_tokens: 2, completion_tokens: 16 })
    const res = await postJson(e.port, '/v1/completions', {
      model: MODEL,
      prompt: 'the cache',
      max_tokens: 3,
      ignore_eos: true,
      stream: true,
    })
    const frames = sseFrames(await res.text())
    expect(frames).toHaveLength(4)
    const chunks = frames.slice(0, 3).map((f) => JSON.parse(f))
    expect(chunks.map((c) => c.object)).toEqual(['text_completion', 'text_completion', 'text_completion'])
    expect(chunks[2].choices[0].finish_reason).toBe('length')
  })

  it('round-trips /tokenize and /detokenize', async () => {
    const prompt = 'the quick model streams tokens over the gateway'
    const tok = await (await postJson(e.port, '/tokenize', { prompt })).json()
    expect(tok.count).toBe(8)
    const detok = await (await postJson(e.port, '/detokenize', { tokens: tok.tokens })).json()
    expect(detok).toEqual({ prompt })
  })

  it('returns vLLM error shapes for an unknown model, bad JSON and too many tokens', async () => {
    const missing = await postJson(e.port, '/v1/chat/completions', { model: 'nope', messages })
    expect(missing.status).toBe(404)
    expect(await missing.json()).toEqual({
      error: {
        message: 'The model `nope` does not exist.',
        type: 'NotFoundError',
        param: 'model',
        code: 404,
      },
    })
    const bad = await fetch(url('/v1/chat/completions'), {
      method: 'POST',
      body: '{nope',
      headers: { 'content-type': 'application/json' },
    })
    expect(bad.status).toBe(400)
    expect((await bad.json()).error.type).toBe('BadRequestError')
    const long = await postJson(e.port, '/v1/chat/completions', { messages, max_tokens: 9000 })
    expect(long.status).toBe(400)
    expect((await long.json()).error.message).toContain("This model's maximum context length is 8192 tokens")
    expect((await fetch(url('/nope'))).status).toBe(404)
    expect((await fetch(url('/sleep'), { method: 'POST' })).status).toBe(404)
  })

  it('stops generating when the client disconnects and logs the abort', async () => {
    const ac = new AbortController()
    const res = await postJson(
      e.port,
      '/v1/chat/completions',
      { model: 'qwen', messages, max_tokens: 500, ignore_eos: true, stream: true },
      ac.signal,
    )
    const reader = (res.body as ReadableStream<Uint8Array>).getReader()
    const first = await reader.read()
    const id = JSON.parse(sseFrames(new TextDecoder().decode(first.value))[0] ?? '{}').id as string
    await reader.read()
    expect(await metric('vllm:num_requests_running')).toBe(1)
    ac.abort()
    await e.waitForOutput(`Aborted request ${id}.`, 3000)
    expect(await metric('vllm:num_requests_running')).toBe(0)
  })

  it('exposes vLLM metrics with model_name and engine labels', async () => {
    const text = await (await fetch(url('/metrics'))).text()
    for (const name of [
      'vllm:num_requests_running{model_name="qwen",engine="0"}',
      'vllm:num_requests_waiting{',
      'vllm:kv_cache_usage_perc{',
      'vllm:prompt_tokens_total{',
      'vllm:generation_tokens_total{',
      'vllm:time_to_first_token_seconds_bucket{',
      'vllm:e2e_request_latency_seconds_count{',
    ]) {
      expect(text).toContain(name)
    }
    expect(await metric('vllm:generation_tokens_total')).toBeGreaterThan(40)
  })

  it('keeps hundreds of concurrent streams flowing', async () => {
    const runs = Array.from({ length: 300 }, async (_, i) => {
      const res = await postJson(e.port, '/v1/completions', {
        model: 'qwen',
        prompt: `p ${i}`,
        max_tokens: 10,
        ignore_eos: true,
        stream: true,
      })
      return sseFrames(await res.text()).length
    })
    const counts = await Promise.all(runs)
    expect(counts.every((c) => c === 11)).toBe(true)
  })

  it('answers the pooling endpoints deterministically', async () => {
    const score = await (await postJson(e.port, '/score', { text_1: 'a', text_2: ['b', 'c'] })).json()
    expect(score.data).toHaveLength(2)
    const again = await (await postJson(e.port, '/v1/score', { text_1: 'a', text_2: ['b', 'c'] })).json()
    expect(again.data).toEqual(score.data)
    const rerank = await (
      await postJson(e.port, '/v2/rerank', { query: 'q', documents: ['x', 'y', 'z'], top_n: 2 })
    ).json()
    expect(rerank.results).toHaveLength(2)
    for (const path of ['/pooling', '/classify', '/rerank', '/v1/rerank']) {
      expect((await postJson(e.port, path, { input: 'hello', query: 'q', documents: ['d'] })).status).toBe(
        200,
      )
    }
  })
})
