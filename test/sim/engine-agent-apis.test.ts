import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { waitFor } from '../support/wait.ts'
import {
  cleanupSims,
  type EngineProc,
  postJson,
  spawnEngine,
  spawnSglang,
  tempSimDir,
  waitHealthy,
} from './helpers.ts'

/**
 * The Responses API (`/v1/responses`) and Anthropic's Messages API (`/v1/messages`) on the engine
 * simulators, through real sockets: the bodies and event streams vLLM renders, usage equal to what
 * the engine counted on /metrics (the chat path's scheduler and counters), a sleeping engine holding
 * them like chat, and older vLLM profiles without the routes.
 */
const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
let e: EngineProc
let sg: EngineProc

beforeAll(async () => {
  e = await spawnEngine(MODEL, ['--served-model-name', 'qwen', '--enable-sleep-mode'], {
    MODELGATE_SIM_DIR: tempSimDir(),
    SIM_TOKENS_PER_SEC: '200',
    SIM_VLLM_VERSION: '0.30.0',
    VLLM_SERVER_DEV_MODE: '1',
    CUDA_VISIBLE_DEVICES: '0',
  })
  sg = await spawnSglang(MODEL, ['--mem-fraction-static', '0.5', '--enable-metrics'], {
    MODELGATE_SIM_DIR: tempSimDir(),
    CUDA_VISIBLE_DEVICES: '0',
    SIM_TOKENS_PER_SEC: '200',
    SIM_SGLANG_HEALTH_TICK_MS: '50',
  })
  await waitHealthy(e)
  await sg.waitForOutput('The server is fired up and ready to roll!')
})

afterAll(cleanupSims)

async function metric(port: number, name: string): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`))
  return Number(line?.split(' ').pop())
}

/** counted runs `f` and returns its result with how much the engine's token counters moved. */
async function counted<T>(port: number, prefix: string, f: () => Promise<T>) {
  const p0 = await metric(port, `${prefix}:prompt_tokens_total`)
  const g0 = await metric(port, `${prefix}:generation_tokens_total`)
  const result = await f()
  return {
    result,
    prompt: (await metric(port, `${prefix}:prompt_tokens_total`)) - p0,
    generation: (await metric(port, `${prefix}:generation_tokens_total`)) - g0,
  }
}

interface Event {
  event: string
  data: Record<string, unknown>
}

function events(text: string): Event[] {
  return text
    .split('\n\n')
    .filter((f) => f.startsWith('event: '))
    .map((f) => {
      const [head, data] = f.split('\n')
      expect(data?.startsWith('data: ')).toBe(true)
      return { event: head?.slice('event: '.length) ?? '', data: JSON.parse(data?.slice(6) ?? '{}') }
    })
}

function collapse(names: string[]): string[] {
  return names.filter((n, i) => n !== names[i - 1])
}

describe('vLLM simulator Responses API', () => {
  it('answers a response with vLLM fields and usage equal to the engine counters', async () => {
    const { result, prompt, generation } = await counted(e.port, 'vllm', async () => {
      const res = await postJson(e.port, '/v1/responses', {
        model: 'qwen',
        input: 'tell me about the river',
        instructions: 'be brief',
        max_output_tokens: 4,
        ignore_eos: true,
      })
      expect(res.status).toBe(200)
      return res.json()
    })
    expect(result).toMatchObject({
      object: 'response',
      model: 'qwen',
      status: 'incomplete',
      incomplete_details: { reason: 'max_output_tokens' },
      instructions: 'be brief',
      max_output_tokens: 4,
      tools: [],
      truncation: 'disabled',
    })
    expect(result.id).toMatch(/^resp_[0-9a-f]{32}$/)
    expect(result.output).toHaveLength(1)
    expect(result.output[0]).toMatchObject({ type: 'message', role: 'assistant', status: 'completed' })
    expect(result.output[0].id).toMatch(/^msg_/)
    expect(result.output[0].content[0]).toMatchObject({ type: 'output_text', annotations: [] })
    expect(result.output[0].content[0].text.split(' ')).toHaveLength(4)
    expect(result.usage.input_tokens).toBe(prompt)
    expect(result.usage.output_tokens).toBe(generation)
    expect(result.usage.output_tokens).toBe(4)
    expect(result.usage.total_tokens).toBe(prompt + 4)
    expect(result.usage.input_tokens_details.cached_tokens).toBe(0)
    expect(result.usage.output_tokens_details.reasoning_tokens).toBe(0)
    // The prompt is the chat template of instructions (system) and input (user).
    const tok = await postJson(e.port, '/tokenize', {
      messages: [
        { role: 'system', content: 'be brief' },
        { role: 'user', content: 'tell me about the river' },
      ],
    })
    expect((await tok.json()).count).toBe(prompt)
  })

  it('streams the response events in order, one text delta per token, ending with the usage', async () => {
    const { result: text, generation } = await counted(e.port, 'vllm', async () => {
      const res = await postJson(e.port, '/v1/responses', {
        input: [{ role: 'user', content: [{ type: 'input_text', text: 'hello there' }] }],
        max_output_tokens: 3,
        ignore_eos: true,
        stream: true,
      })
      expect(res.headers.get('content-type')).toContain('text/event-stream')
      return res.text()
    })
    const evs = events(text)
    expect(collapse(evs.map((x) => x.event))).toEqual([
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
      'response.output_text.delta',
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.completed',
    ])
    expect(evs.map((x) => x.data['sequence_number'])).toEqual(evs.map((_, i) => i))
    for (const x of evs) expect(x.data['type']).toBe(x.event)
    const deltas = evs.filter((x) => x.event === 'response.output_text.delta').map((x) => x.data['delta'])
    expect(deltas).toHaveLength(3)
    expect(generation).toBe(3)
    const done = evs.find((x) => x.event === 'response.output_text.done')
    expect(done?.data['text']).toBe(deltas.join(''))
    const created = evs[0]?.data['response'] as Record<string, unknown>
    expect(created).toMatchObject({ status: 'in_progress', output: [], usage: null })
    const completed = evs.at(-1)?.data['response'] as {
      id: string
      usage: { output_tokens: number }
      output: { content: { text: string }[] }[]
    }
    expect(completed.id).toBe(created['id'] as string)
    expect(completed.usage.output_tokens).toBe(3)
    expect(completed.output[0]?.content[0]?.text).toBe(deltas.join(''))
    expect(text).not.toContain('[DONE]')
  })
})

describe('vLLM simulator Messages API', () => {
  const messages = [{ role: 'user', content: 'tell me about the mountain' }]

  it('answers a message with its stop reason and usage equal to the engine counters', async () => {
    const { result, prompt, generation } = await counted(e.port, 'vllm', async () => {
      const res = await postJson(e.port, '/v1/messages', {
        model: 'qwen',
        system: [{ type: 'text', text: 'be brief' }],
        messages,
        max_tokens: 3,
      })
      expect(res.status).toBe(200)
      return res.json()
    })
    expect(result).toMatchObject({
      type: 'message',
      role: 'assistant',
      model: 'qwen',
      stop_reason: 'max_tokens',
    })
    expect(result.content).toHaveLength(1)
    expect(result.content[0].type).toBe('text')
    expect(result.content[0].text.split(' ')).toHaveLength(3)
    expect(result.usage).toEqual({ input_tokens: prompt, output_tokens: generation })
    expect(generation).toBe(3)
    expect('stop_sequence' in result).toBe(false)
    const tok = await postJson(e.port, '/tokenize', {
      messages: [{ role: 'system', content: 'be brief' }, ...messages],
    })
    expect((await tok.json()).count).toBe(prompt)
  })

  it('ends on its own turn with end_turn', async () => {
    const res = await postJson(e.port, '/v1/messages', { model: 'qwen', messages, max_tokens: 1000 })
    expect((await res.json()).stop_reason).toBe('end_turn')
  })

  it('streams message_start, one text_delta per token, message_delta with usage, message_stop', async () => {
    const {
      result: text,
      prompt,
      generation,
    } = await counted(e.port, 'vllm', async () => {
      const res = await postJson(e.port, '/v1/messages', {
        model: 'qwen',
        messages,
        max_tokens: 3,
        stream: true,
      })
      return res.text()
    })
    const evs = events(text)
    expect(evs.map((x) => x.event)).toEqual([
      'message_start',
      'content_block_start',
      'content_block_delta',
      'content_block_delta',
      'content_block_delta',
      'content_block_stop',
      'message_delta',
      'message_stop',
    ])
    for (const x of evs) expect(x.data['type']).toBe(x.event)
    expect(evs[0]?.data['message']).toMatchObject({
      content: [],
      model: 'qwen',
      stop_reason: null,
      usage: { input_tokens: prompt, output_tokens: 0 },
    })
    expect(evs[1]?.data).toEqual({
      type: 'content_block_start',
      content_block: { type: 'text', text: '' },
      index: 0,
    })
    expect(evs[2]?.data['delta']).toMatchObject({ type: 'text_delta' })
    expect(evs[6]?.data).toEqual({
      type: 'message_delta',
      delta: { stop_reason: 'max_tokens' },
      usage: { input_tokens: prompt, output_tokens: generation },
    })
    expect(generation).toBe(3)
  })

  it("answers an unknown model with vLLM's 404 in the Anthropic error shape, a missing max_tokens with a 400", async () => {
    const res = await postJson(e.port, '/v1/messages', { model: 'nope', messages, max_tokens: 3 })
    expect(res.status).toBe(404)
    expect(await res.json()).toEqual({
      type: 'error',
      error: { type: 'NotFoundError', message: 'The model `nope` does not exist.' },
    })
    const bad = await postJson(e.port, '/v1/messages', { model: 'qwen', messages })
    expect(bad.status).toBe(400)
    expect((await bad.json()).error.type).toBe('BadRequestError')
  })

  it('holds a message on a sleeping engine until the wake, as it does a chat', async () => {
    const base = `http://127.0.0.1:${e.port}`
    expect((await fetch(`${base}/sleep?level=1`, { method: 'POST' })).status).toBe(200)
    let answered = false
    const pending = postJson(e.port, '/v1/messages', { model: 'qwen', messages, max_tokens: 2 }).then((r) => {
      answered = true
      return r
    })
    await waitFor('the message to be queued while asleep', async () => {
      const text = await (await fetch(`${base}/metrics`)).text()
      return /vllm:num_requests_waiting\{[^}]*\} 1\.0/.test(text) ? true : undefined
    })
    expect(answered).toBe(false)
    await fetch(`${base}/wake_up`, { method: 'POST' })
    expect((await (await pending).json()).usage.output_tokens).toBe(2)
  })
})

describe('older vLLM profiles', () => {
  it('0.11.0 has the Responses API but no Messages API; 0.8.5 has neither', async () => {
    const old = await spawnEngine(MODEL, [], { MODELGATE_SIM_DIR: tempSimDir(), SIM_VLLM_VERSION: '0.11.0' })
    await waitHealthy(old)
    const msg = await postJson(old.port, '/v1/messages', {
      model: MODEL,
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 2,
    })
    expect(msg.status).toBe(404)
    expect(await msg.json()).toEqual({ detail: 'Not Found' })
    expect((await postJson(old.port, '/v1/responses', { input: 'hi', max_output_tokens: 2 })).status).toBe(
      200,
    )
    const v0 = await spawnEngine(MODEL, [], { MODELGATE_SIM_DIR: tempSimDir(), SIM_VLLM_VERSION: '0.8.5' })
    await waitHealthy(v0)
    expect((await postJson(v0.port, '/v1/responses', { input: 'hi' })).status).toBe(404)
  })
})

describe('SGLang simulator', () => {
  it('serves both APIs plain and streamed with usage equal to its token counters', async () => {
    const r = await counted(sg.port, 'sglang', async () =>
      (
        await postJson(sg.port, '/v1/responses', {
          input: 'hi there',
          max_output_tokens: 3,
          ignore_eos: true,
        })
      ).json(),
    )
    expect(r.result.usage.input_tokens).toBe(r.prompt)
    expect(r.result.usage.output_tokens).toBe(r.generation)
    const m = await counted(sg.port, 'sglang', async () =>
      (
        await postJson(sg.port, '/v1/messages', {
          model: 'any',
          messages: [{ role: 'user', content: 'hi' }],
          max_tokens: 3,
        })
      ).json(),
    )
    expect(m.result).toMatchObject({ type: 'message', model: 'any', stop_reason: 'max_tokens' })
    // SGLang's converter: its own msg_ id and a cache_read_input_tokens in the usage.
    expect(m.result.id).toMatch(/^msg_[0-9a-f]{32}$/)
    expect(m.result.usage).toEqual({
      input_tokens: m.prompt,
      output_tokens: m.generation,
      cache_read_input_tokens: 0,
    })
    const rs = await postJson(sg.port, '/v1/responses', {
      input: 'hi',
      max_output_tokens: 2,
      ignore_eos: true,
      stream: true,
    })
    const revs = events(await rs.text())
    expect(revs[0]?.event).toBe('response.created')
    expect(revs.at(-1)?.event).toBe('response.completed')
    expect(revs.filter((x) => x.event === 'response.output_text.delta')).toHaveLength(2)
    const ms = await postJson(sg.port, '/v1/messages', {
      model: 'any',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 2,
      stream: true,
    })
    const mevs = events(await ms.text())
    expect(mevs.map((x) => x.event)).toEqual([
      'message_start',
      'content_block_start',
      'content_block_delta',
      'content_block_delta',
      'content_block_stop',
      'message_delta',
      'message_stop',
    ])
    // Its message_start has type and role, and input_tokens 0 (its chat stream has usage only at the end).
    expect(mevs[0]?.data['message']).toMatchObject({
      type: 'message',
      role: 'assistant',
      usage: { input_tokens: 0 },
    })
    const usage = mevs[5]?.data['usage'] as { input_tokens: number; output_tokens: number }
    expect(usage.output_tokens).toBe(2)
    expect(usage.input_tokens).toBeGreaterThan(0)
  })
})
