import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import Anthropic from '@anthropic-ai/sdk'
import OpenAI from 'openai'
import { cleanupSims, freePort } from '../sim/helpers.ts'
import { waitFor } from '../support/wait.ts'
import { startRouterWithGateway, type TestRouter } from './support.ts'

/**
 * Today's client APIs, routed by model: the official `openai` client's `responses.create` and
 * Anthropic's own client's `messages.create` (its key as `x-api-key`), plain and streamed, against
 * the gateway's listener and the router's, with inference keys on, through a real gateway and its
 * simulated vLLM. What a key is charged is what the engine counted; modelgate's own refusals come in
 * each API's own shape (Anthropic's body and status codes on /v1/messages).
 */
const GW = 'gw-apis'
const base = await freePort()

let r: TestRouter & { simDir: string }

const admin = <T = Record<string, unknown>>(path: string, init?: RequestInit) => r.main<T>(path, init)

beforeAll(async () => {
  r = await startRouterWithGateway(
    [base, base + 9],
    'from_gateway: true\nwake_on_request: hold\n',
    {},
    `    proxy: { wake_on_request: hold }
    catalog:
      - { name: on-demand, model_path: org/on-demand-7b, gpu_memory_utilization: 0.3 }
`,
  )
  const load = await admin<{ instance_id: string }>('/api/v1/models/load', {
    method: 'POST',
    body: JSON.stringify({ model_path: 'org/gw-apis-base', served_model_name: GW }),
  })
  expect(load.status).toBe(202)
  const id = load.body.instance_id
  await waitFor(
    'instance active',
    async () =>
      (await admin<{ model: { status: string } }>(`/api/v1/models/${id}`)).body.model.status === 'active',
    { timeoutMs: 30_000 },
  )
})

afterAll(async () => {
  await r?.stop()
  cleanupSims()
})

interface Made {
  id: string
  key: string
}

async function makeKey(body: Record<string, unknown>): Promise<Made> {
  const made = await admin<Made>('/api/keys', { method: 'POST', body: JSON.stringify(body) })
  expect(made.status).toBe(201)
  return made.body
}

/** spent: a key with a budget of 1 token, spent by one chat (a budget is checked before a request, not during). */
async function spent(name: string): Promise<Made> {
  const made = await makeKey({ name, budget_tokens: 1 })
  const res = await fetch(`${r.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${made.key}` },
    body: JSON.stringify({ model: GW, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }),
  })
  expect(res.status).toBe(200)
  await res.text()
  expect(await usedWhenIdle(made.id)).toBeGreaterThan(1)
  return made
}

/** usedWhenIdle: a key's spent budget once none of its requests is in flight. */
const usedWhenIdle = (id: string) =>
  waitFor(`key ${id} idle`, async () => {
    const d = (await admin<{ state: { in_flight: number; budget_used: number | null } }>(`/api/keys/${id}`))
      .body
    return d.state.in_flight === 0 && d.state.budget_used
  })

const listeners = (): [string, string][] => [
  ['gateway', r.url],
  ['router', r.routerUrl],
]

describe('the OpenAI Responses API (openai client)', () => {
  it('answers plain and streamed on both listeners, and the key is charged what the engine counted', async () => {
    const { id, key } = await makeKey({ name: 'responses', budget_tokens: 1_000_000 })
    let counted = 0
    for (const [name, url] of listeners()) {
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0, timeout: 20_000 })
      const res = await client.responses.create({ model: GW, input: 'Say hello', max_output_tokens: 6 })
      // vLLM's status is `incomplete` (reason max_output_tokens) when the limit ended the answer.
      expect([name, res.object]).toEqual([name, 'response'])
      expect(res.status).toMatch(/^(completed|incomplete)$/)
      expect(res.output_text.length).toBeGreaterThan(0)
      expect(res.usage!.input_tokens).toBeGreaterThan(0)
      expect(res.usage!.output_tokens).toBeGreaterThan(0)
      counted += res.usage!.input_tokens + res.usage!.output_tokens

      const stream = await client.responses.create({
        model: GW,
        input: [{ role: 'user', content: 'Count to three' }],
        max_output_tokens: 5,
        stream: true,
      })
      let text = ''
      let usage: { input_tokens: number; output_tokens: number } | null = null
      for await (const ev of stream) {
        if (ev.type === 'response.output_text.delta') text += ev.delta
        if (ev.type === 'response.completed') usage = ev.response.usage ?? null
      }
      expect(text.length, name).toBeGreaterThan(0)
      expect(usage!.output_tokens, name).toBeGreaterThan(0)
      counted += usage!.input_tokens + usage!.output_tokens
    }
    expect(await usedWhenIdle(id)).toBe(counted)
  })

  it("refuses in OpenAI's shape: an unknown model, a key over its budget", async () => {
    const { key } = await spent('responses-limits')
    const open = await makeKey({ name: 'responses-open' })
    for (const [name, url] of listeners()) {
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0, timeout: 20_000 })
      const unknown = await new OpenAI({ baseURL: `${url}/v1`, apiKey: open.key, maxRetries: 0 }).responses
        .create({ model: 'nope', input: 'x' })
        .catch((e: unknown) => e)
      // The gateway answers an unknown model 400 (param model), the router 404: each as it does for chat.
      expect(unknown, name).toBeInstanceOf(name === 'gateway' ? OpenAI.BadRequestError : OpenAI.NotFoundError)
      expect((unknown as InstanceType<typeof OpenAI.APIError>).code).toMatch(
        /^(invalid_model|model_not_found)$/,
      )
      const over = await client.responses
        .create({ model: GW, input: 'x', max_output_tokens: 50 })
        .catch((e: unknown) => e)
      expect(over, name).toBeInstanceOf(OpenAI.RateLimitError)
    }
  })
})

describe("Anthropic's Messages API (@anthropic-ai/sdk, x-api-key)", () => {
  it('answers plain and streamed on both listeners, and the key is charged what the engine counted', async () => {
    const { id, key } = await makeKey({ name: 'messages', budget_tokens: 1_000_000 })
    let counted = 0
    for (const [name, url] of listeners()) {
      const client = new Anthropic({ baseURL: url, apiKey: key, maxRetries: 0, timeout: 20_000 })
      const msg = await client.messages.create({
        model: GW,
        max_tokens: 6,
        system: 'Be brief.',
        messages: [{ role: 'user', content: 'Say hello' }],
      })
      expect([name, msg.type, msg.role]).toEqual([name, 'message', 'assistant'])
      expect(msg.content[0]?.type).toBe('text')
      expect(msg.usage.input_tokens).toBeGreaterThan(0)
      expect(msg.usage.output_tokens).toBeGreaterThan(0)
      counted += msg.usage.input_tokens + msg.usage.output_tokens

      const stream = await client.messages.create({
        model: GW,
        max_tokens: 5,
        messages: [{ role: 'user', content: 'Count to three' }],
        stream: true,
      })
      let text = ''
      let input = 0
      let output = 0
      const types: string[] = []
      for await (const ev of stream) {
        types.push(ev.type)
        if (ev.type === 'message_start') input = ev.message.usage.input_tokens
        if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text
        if (ev.type === 'message_delta') output = ev.usage.output_tokens
      }
      expect([types[0], types.at(-1)], name).toEqual(['message_start', 'message_stop'])
      expect(text.length, name).toBeGreaterThan(0)
      expect(output, name).toBeGreaterThan(0)
      counted += input + output
    }
    expect(await usedWhenIdle(id)).toBe(counted)
  })

  it('loads a catalogued model on demand for a Messages request, and streams its answer', async () => {
    const { key } = await makeKey({ name: 'messages-on-demand' })
    const client = new Anthropic({ baseURL: r.routerUrl, apiKey: key, maxRetries: 0, timeout: 60_000 })
    const stream = await client.messages.create({
      model: 'on-demand',
      max_tokens: 4,
      messages: [{ role: 'user', content: 'hello' }],
      stream: true,
    })
    let text = ''
    for await (const ev of stream)
      if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text
    expect(text.length).toBeGreaterThan(0)
    const listed = (await (
      await fetch(`${r.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } })
    ).json()) as { data: { id: string; state: string }[] }
    expect(listed.data.find((m) => m.id === 'on-demand')?.state).toBe('active')
  })

  it("refuses in Anthropic's shape and status codes", async () => {
    const limited = await spent('messages-limits')
    const elsewhere = await makeKey({ name: 'messages-other-model', models: ['some-other-model'] })
    const open = await makeKey({ name: 'messages-open' })
    for (const [name, url] of listeners()) {
      const ask = (apiKey: string, model = GW) =>
        new Anthropic({ baseURL: url, apiKey, maxRetries: 0, timeout: 20_000 }).messages
          .create({ model, max_tokens: 50, messages: [{ role: 'user', content: 'x' }] })
          .then(
            () => {
              throw new Error(`${name}: the request for ${model} was answered 200`)
            },
            (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
          )
      const cases: [string, InstanceType<typeof Anthropic.APIError>, number, string][] = [
        ['unknown model', await ask(open.key, 'nope'), 404, 'not_found_error'],
        ['wrong key', await ask('sk-not-a-key'), 401, 'authentication_error'],
        ['over budget', await ask(limited.key), 429, 'rate_limit_error'],
        ['model not on the key', await ask(elsewhere.key), 403, 'permission_error'],
      ]
      for (const [what, err, status, type] of cases) {
        expect([name, what, err.status], `${name} ${what}`).toEqual([name, what, status])
        // Anthropic's body: {type: "error", error: {type, message}}, read by its client as `error`.
        expect(err.error, `${name} ${what}`).toMatchObject({ type: 'error', error: { type } })
      }
    }
  })
})

describe('hostile bodies on the new routes (through real sockets, keys on)', () => {
  const post = (url: string, path: string, key: string, body: string) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': key, authorization: `Bearer ${key}` },
      body,
      signal: AbortSignal.timeout(30_000),
    })

  it("refuses deep JSON and a model that is a path in each API's own shape, and passes a huge input on", async () => {
    const { key } = await makeKey({ name: 'hostile-apis' })
    const deep = `{"model":"${GW}","max_tokens":4,"messages":${'['.repeat(5000)}${']'.repeat(5000)}}`
    for (const [name, url] of listeners()) {
      const m = await post(url, '/v1/messages', key, deep)
      expect([name, m.status]).toEqual([name, 400])
      expect(await m.json()).toMatchObject({ type: 'error', error: { type: 'invalid_request_error' } })
      const rsp = await post(url, '/v1/responses', key, deep.replace('"messages"', '"input"'))
      expect([name, rsp.status]).toEqual([name, 400])
      expect(((await rsp.json()) as { error: { type: string } }).error.type).toMatch(/invalid_request/)

      for (const model of ['../../api/keys', '/api/v1/models/load', 'http://127.0.0.1:1/v1']) {
        const body = JSON.stringify({ model, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] })
        const res = await post(url, '/v1/messages', key, body)
        expect([name, model, res.status]).toEqual([name, model, 404])
        expect(await res.json()).toMatchObject({ type: 'error', error: { type: 'not_found_error' } })
      }

      // 20,000 input items: forwarded whole; the engine's own answer comes back (no modelgate 5xx).
      const items = Array.from({ length: 20_000 }, () => ({ role: 'user', content: 'hi' }))
      const huge = await post(
        url,
        '/v1/responses',
        key,
        JSON.stringify({ model: GW, input: items, max_output_tokens: 2 }),
      )
      const answer = (await huge.json()) as { object?: string; error?: { message: string } }
      expect([name, huge.status < 500]).toEqual([name, true])
      expect(answer.object === 'response' || typeof answer.error?.message === 'string').toBe(true)
    }
  })
})
