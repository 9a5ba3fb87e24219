import {
  FakeGateway,
  instance,
  type ProxyHost,
  type Stub,
  type StubHandler,
  startProxyHost,
  startStub,
} from '../wire/support.ts'

/**
 * Test support for inference keys: a real Host with auth on (simple mode, so the keys API takes an
 * admin JWT), the gateway's inference proxy over a fake gateway whose one model (`m`, served as
 * `model-a`; a second, `model-b`) is a stub engine that counts tokens as an engine does and says so
 * in `usage`: in the JSON reply, and in a last stream chunk when the request asks
 * (`stream_options.include_usage`), like vLLM.
 */
export const ADMIN_PASSWORD = 'keys-test-password'
export const AUTH_ENV = {
  AUTH_MODE: 'simple',
  ADMIN_USERNAME: 'admin',
  ADMIN_PASSWORD,
  JWT_SECRET: 'k'.repeat(40),
}

/** EngineTally: what the stub engine reported in `usage`, summed, and what it was asked. */
export interface EngineTally {
  prompt: number
  completion: number
  requests: number
  /** The bodies it received, parsed. */
  bodies: Record<string, unknown>[]
}

const encoder = new TextEncoder()

/** laxTrue: a flag as vLLM reads it (pydantic's lax booleans: true, 1, "true", "yes", "on"… in any case). */
function laxTrue(v: unknown): boolean {
  if (v === true || v === 1) return true
  return typeof v === 'string' && ['1', 'on', 't', 'true', 'y', 'yes'].includes(v.toLowerCase())
}

/** promptTokens: the stub's tokenizer: one token per word of the messages or prompt. */
function promptTokens(body: Record<string, unknown>): number {
  const text = JSON.stringify(body['messages'] ?? body['prompt'] ?? '')
  return text.split(/\s+/).length + 3
}

/**
 * usageEngine: a stub handler that answers chat requests like vLLM, with `usage` as it counted:
 * `max_tokens` tokens (default 6), each a chunk `gapMs` apart when streamed. `hold` (when set)
 * delays each chunk after the first until it resolves (a test controls the stream's pace).
 */
export function usageEngine(
  tally: EngineTally,
  opts: { gapMs?: number; hold?: () => Promise<void> } = {},
): StubHandler {
  return (_req, seen) => {
    let body: Record<string, unknown>
    try {
      body = JSON.parse(new TextDecoder().decode(seen.body)) as Record<string, unknown>
    } catch {
      return Response.json(
        { error: { message: 'bad json', type: 'BadRequestError', code: 400 } },
        { status: 400 },
      )
    }
    tally.bodies.push(body)
    tally.requests++
    const prompt = promptTokens(body)
    const completion = typeof body['max_tokens'] === 'number' ? body['max_tokens'] : 6
    tally.prompt += prompt
    tally.completion += completion
    const usage = { prompt_tokens: prompt, total_tokens: prompt + completion, completion_tokens: completion }
    const head = {
      id: 'chatcmpl-k',
      object: 'chat.completion.chunk',
      created: 1_700_000_000,
      model: body['model'],
    }
    if (!laxTrue(body['stream']))
      return Response.json({
        ...head,
        object: 'chat.completion',
        choices: [
          {
            index: 0,
            message: { role: 'assistant', content: 'x '.repeat(completion) },
            finish_reason: 'length',
          },
        ],
        usage,
      })
    const frames: string[] = []
    for (let i = 0; i < completion; i++)
      frames.push(
        `data: ${JSON.stringify({ ...head, choices: [{ index: 0, delta: { content: `t${i} ` }, finish_reason: i === completion - 1 ? 'length' : null }] })}\n\n`,
      )
    const options = body['stream_options'] as { include_usage?: unknown } | undefined
    if (laxTrue(options?.include_usage))
      frames.push(`data: ${JSON.stringify({ ...head, choices: [], usage })}\n\n`)
    frames.push('data: [DONE]\n\n')
    let i = 0
    return new Response(
      new ReadableStream<Uint8Array>(
        {
          async pull(c) {
            if (i > 0 && opts.hold) await opts.hold()
            else if (i > 0 && opts.gapMs) await Bun.sleep(opts.gapMs)
            if (i >= frames.length) return c.close()
            c.enqueue(encoder.encode(frames[i++]!))
          },
        },
        { highWaterMark: 0 },
      ),
      { headers: { 'content-type': 'text/event-stream; charset=utf-8' } },
    )
  }
}

export interface KeysHost {
  px: ProxyHost
  url: string
  stub: Stub
  tally: EngineTally
  api: FakeGateway
  token: string
  /** admin: a call to the admin API with the admin JWT; the parsed JSON body. */
  admin<T = Record<string, unknown>>(
    method: string,
    path: string,
    body?: unknown,
  ): Promise<{ status: number; body: T }>
  /** createKey: POST /api/keys; the new key's id and secret. */
  createKey(fields: Record<string, unknown>): Promise<{ id: string; key: string }>
  stop(): Promise<void>
}

export interface KeysHostOptions {
  env?: Record<string, string>
  engine?: { gapMs?: number; hold?: () => Promise<void> }
  logSink?: (line: string) => void
  logLevel?: 'debug' | 'info' | 'warn' | 'error'
}

/** startKeysHost boots the host and the stub engine, and logs in as admin. */
export async function startKeysHost(o: KeysHostOptions = {}): Promise<KeysHost> {
  const tally: EngineTally = { prompt: 0, completion: 0, requests: 0, bodies: [] }
  const stub = startStub(usageEngine(tally, o.engine))
  const api = new FakeGateway()
  api.add(instance('m', stub.port, { served_model_name: 'model-a' }))
  api.add(instance('n', stub.port, { served_model_name: 'model-b' }))
  const px = await startProxyHost(api, {
    env: { ...AUTH_ENV, ...o.env },
    ...(o.logSink ? { logSink: o.logSink } : {}),
    ...(o.logLevel ? { logLevel: o.logLevel } : {}),
  })
  const login = await fetch(`${px.url}/api/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'admin', password: ADMIN_PASSWORD }),
  })
  const token = ((await login.json()) as { token: string }).token
  const admin = async <T>(method: string, path: string, body?: unknown) => {
    const res = await fetch(`${px.url}${path}`, {
      method,
      headers: {
        authorization: `Bearer ${token}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) }),
    })
    return { status: res.status, body: (await res.json()) as T }
  }
  return {
    px,
    url: px.url,
    stub,
    tally,
    api,
    token,
    admin,
    async createKey(fields) {
      const r = await admin<{ id: string; key: string }>('POST', '/api/keys', fields)
      if (r.status !== 201) throw new Error(`POST /api/keys: ${r.status} ${JSON.stringify(r.body)}`)
      return r.body
    },
    async stop() {
      await px.stop()
      stub.stop()
    },
  }
}

/** chat: POST /v1/chat/completions with `key` (null: no Authorization) for `model`. */
export function chat(
  url: string,
  key: string | null,
  body: Record<string, unknown> = {},
  model = 'model-a',
): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify({
      model,
      messages: [{ role: 'user', content: 'hello there' }],
      max_tokens: 4,
      ...body,
    }),
  })
}
