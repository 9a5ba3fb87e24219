import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import OpenAI from 'openai'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import { modelsYaml, startRouter, startSim, type TestRouter } from './support.ts'

/** The `openai` npm client pointed at the router works unchanged; its API key is ignored. */
const MODEL = 'Qwen/Qwen2.5-7B-Instruct'

let engine: EngineProc
let r: TestRouter
let client: OpenAI

beforeAll(async () => {
  engine = await startSim(MODEL)
  r = await startRouter(modelsYaml([{ name: MODEL, port: engine.port }]))
  client = new OpenAI({ baseURL: `${r.routerUrl}/v1`, apiKey: 'sk-anything', maxRetries: 0, timeout: 20_000 })
})

afterAll(async () => {
  await r?.stop()
  await cleanupSims()
})

describe('router with the openai client', () => {
  it('chats without streaming', async () => {
    const res = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Say hello' }],
      max_tokens: 5,
    })
    expect(res.object).toBe('chat.completion')
    expect(res.model).toBe(MODEL)
    expect(res.choices[0]!.message.role).toBe('assistant')
    expect(typeof res.choices[0]!.message.content).toBe('string')
    expect(res.usage!.completion_tokens).toBeGreaterThan(0)
  })

  it('chats with streaming', async () => {
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Count to three' }],
      max_tokens: 6,
      stream: true,
    })
    let text = ''
    let chunks = 0
    let finish: string | null = null
    for await (const chunk of stream) {
      expect(chunk.object).toBe('chat.completion.chunk')
      chunks++
      text += chunk.choices[0]?.delta?.content ?? ''
      finish = chunk.choices[0]?.finish_reason ?? finish
    }
    expect(chunks).toBeGreaterThan(1)
    expect(text.length).toBeGreaterThan(0)
    expect(finish).not.toBeNull()
  })

  it('completes text and lists models', async () => {
    const res = await client.completions.create({ model: MODEL, prompt: 'Once upon', max_tokens: 3 })
    expect(res.object).toBe('text_completion')
    expect(res.choices[0]!.text.length).toBeGreaterThan(0)
    const models = await client.models.list()
    expect(models.data.map((m) => m.id)).toEqual([MODEL])
  })

  it('surfaces router errors as API errors', async () => {
    const err = await client.chat.completions
      .create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.NotFoundError)
    expect((err as InstanceType<typeof OpenAI.NotFoundError>).code).toBe('model_not_found')
    const stats = await r.get<{ overall: { total_requests: number; successful_requests: number } }>(
      '/traffic/stats',
    )
    expect(stats.body.overall).toMatchObject({ total_requests: 3, successful_requests: 3 })
  })
})
