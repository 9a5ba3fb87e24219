import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { waitFor } from '../support/wait.ts'
import {
  CHAT_REPLY,
  errorOf,
  FakeGateway,
  instance,
  type ProxyHost,
  postJson,
  type Stub,
  startProxyHost,
  startStub,
} from './support.ts'

/** Every error the inference proxy renders or passes through, with exact status and shape. */
describe('inference proxy errors', () => {
  const api = new FakeGateway()
  let stub: Stub
  let px: ProxyHost
  let closedPort: number

  beforeAll(async () => {
    stub = startStub()
    const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
    closedPort = probe.port
    probe.stop(true)
    api.add(instance('good', stub.port))
    api.add(instance('warming', stub.port, { status: 'starting' }))
    api.add(instance('dozing', stub.port, { status: 'sleeping', enable_sleep_mode: true }))
    api.add(instance('gone', closedPort))
    px = await startProxyHost(api, { firstByteTimeoutMs: 400 })
  })
  afterAll(async () => {
    await px.stop()
    stub.stop()
  })

  const chat = (body: unknown) => postJson(`${px.url}/v1/chat/completions`, body)
  const msg = { messages: [{ role: 'user', content: 'hi' }] }

  // The refusal is the gateway's own (the model directory finds no backend): it used to be worded by
  // this fake gateway, which no longer words refusals.
  it('answers an unknown model with 400 invalid_model on param model', async () => {
    const res = await chat({ model: 'nope', ...msg })
    expect(res.status).toBe(400)
    expect(await errorOf(res)).toEqual({
      message: "The model 'nope' does not exist",
      type: 'invalid_request_error',
      param: 'model',
      code: 'invalid_model',
    })
  })

  it('answers a starting model with 503 model_not_ready and Retry-After', async () => {
    const res = await chat({ model: 'warming', ...msg })
    expect(res.status).toBe(503)
    expect(res.headers.get('retry-after')).toBe('5')
    expect(await errorOf(res)).toMatchObject({ type: 'service_unavailable', code: 'model_not_ready' })
  })

  it('answers a sleeping model with 503 model_sleeping and Retry-After', async () => {
    const res = await chat({ model: 'dozing', ...msg })
    expect(res.status).toBe(503)
    expect(res.headers.get('retry-after')).toBe('30')
    expect(await errorOf(res)).toMatchObject({ type: 'service_unavailable', code: 'model_sleeping' })
  })

  it('answers a body that is not JSON with 400 invalid_json', async () => {
    const res = await chat('{"model": "good", oops')
    expect(res.status).toBe(400)
    expect(await errorOf(res)).toEqual({
      message: 'Request body is not valid JSON',
      type: 'invalid_request_error',
      code: 'invalid_json',
    })
  })

  it('answers an empty body with 400 invalid_json', async () => {
    const res = await fetch(`${px.url}/v1/chat/completions`, { method: 'POST' })
    expect(res.status).toBe(400)
    expect((await errorOf(res)).code).toBe('invalid_json')
  })

  it.each([
    ['no model', msg],
    ['a numeric model', { model: 42, ...msg }],
    ['an empty model', { model: '', ...msg }],
  ])('answers %s with 400 missing_model on param model', async (_name, body) => {
    const res = await chat(body)
    expect(res.status).toBe(400)
    expect(await errorOf(res)).toMatchObject({
      type: 'invalid_request_error',
      code: 'missing_model',
      param: 'model',
    })
  })

  it('answers a JSON array with 400 invalid_request', async () => {
    const res = await chat([{ model: 'good' }])
    expect(res.status).toBe(400)
    expect((await errorOf(res)).code).toBe('invalid_request')
  })

  it.each([
    [
      'the newer vLLM error shape',
      400,
      '{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}}',
    ],
    [
      'the older vLLM error shape',
      400,
      '{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}',
    ],
    ['a 404 from the engine', 404, '{"detail":"Not Found"}'],
    [
      'a 500 from the engine',
      500,
      '{"error":{"message":"EngineCore died","type":"InternalServerError","code":500}}',
    ],
  ])('passes %s through with its status and exact body', async (_name, status, body) => {
    stub.handler = () => new Response(body, { status, headers: { 'content-type': 'application/json' } })
    try {
      const res = await chat({ model: 'good', ...msg })
      expect(res.status).toBe(status)
      expect(res.headers.get('content-type')).toBe('application/json')
      expect(await res.text()).toBe(body)
    } finally {
      stub.handler = () => Response.json(CHAT_REPLY)
    }
  })

  it('answers a refused connection with 502 upstream_unavailable', async () => {
    const res = await chat({ model: 'gone', ...msg })
    expect(res.status).toBe(502)
    expect(await errorOf(res)).toEqual({
      message: 'The model engine is unavailable (connection refused)',
      type: 'bad_gateway',
      code: 'upstream_unavailable',
    })
  })

  it('answers an engine that sends no headers before the first-byte deadline with 504 upstream_timeout', async () => {
    let upstreamAborted = false
    // An engine that answers only once the proxy gave up on it (which it must, at 400 ms).
    stub.handler = async (req) => {
      const aborted = Promise.withResolvers<void>()
      req.signal.addEventListener('abort', () => {
        upstreamAborted = true
        aborted.resolve()
      })
      await aborted.promise
      return Response.json(CHAT_REPLY)
    }
    try {
      const t0 = performance.now()
      const res = await chat({ model: 'good', ...msg })
      const ms = performance.now() - t0
      expect(res.status).toBe(504)
      expect(await errorOf(res)).toEqual({
        message: 'The model engine sent nothing within 400 ms',
        type: 'gateway_timeout',
        code: 'upstream_timeout',
      })
      // Not before its deadline (a floor only: a busy machine answers later, never earlier).
      expect(ms).toBeGreaterThanOrEqual(380)
      await waitFor('the engine to see the abort', () => upstreamAborted, { timeoutMs: 2000 })
    } finally {
      stub.handler = () => Response.json(CHAT_REPLY)
    }
  })

  it('answers an accepted-but-silent socket (half-open engine) with 504 too', async () => {
    const silent = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
    api.add(instance('silent', silent.port))
    try {
      const res = await chat({ model: 'silent', ...msg })
      expect(res.status).toBe(504)
      expect((await errorOf(res)).code).toBe('upstream_timeout')
    } finally {
      api.instances.delete('silent')
      silent.stop(true)
    }
  })

  // A listener with a full accept queue drops SYNs: the closest local stand-in for a blackholed host.
  it.skipIf(!Bun.which('python3'))(
    'answers an unreachable engine with 504 upstream_connect_timeout at the connect deadline',
    async () => {
      const py = Bun.spawn(
        [
          'python3',
          '-c',
          "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen(0)\nprint(s.getsockname()[1],flush=True)\ntime.sleep(30)",
        ],
        { stdout: 'pipe' },
      )
      try {
        const first = await py.stdout.getReader().read()
        const port = Number(new TextDecoder().decode(first.value).trim())
        // One connection fills the accept queue of backlog 0; the next SYNs are dropped.
        await Bun.connect({ hostname: '127.0.0.1', port, socket: { data() {} } })
        api.add(instance('blackhole', port))
        const slow = await startProxyHost(api, { firstByteTimeoutMs: 10_000, connectTimeoutMs: 300 })
        try {
          // The connect deadline, not the 10 s first-byte one, answered: the message names it.
          const res = await postJson(`${slow.url}/v1/chat/completions`, { model: 'blackhole', ...msg })
          expect(res.status).toBe(504)
          expect(await errorOf(res)).toEqual({
            message: 'Could not connect to the model engine within 300 ms',
            type: 'gateway_timeout',
            code: 'upstream_connect_timeout',
          })
        } finally {
          await slow.stop()
          api.instances.delete('blackhole')
        }
      } finally {
        py.kill()
      }
    },
  )

  it('keeps waiting past the connect deadline for an engine that is up but slow to answer', async () => {
    // Slowness is what this engine is about: it answers twice the connect deadline late.
    stub.handler = async () => {
      await Bun.sleep(400)
      return Response.json(CHAT_REPLY)
    }
    const patient = await startProxyHost(api, { firstByteTimeoutMs: 5000, connectTimeoutMs: 200 })
    try {
      const res = await postJson(`${patient.url}/v1/chat/completions`, { model: 'good', ...msg })
      expect(res.status).toBe(200)
      expect(await res.json()).toEqual(CHAT_REPLY)
    } finally {
      await patient.stop()
      stub.handler = () => Response.json(CHAT_REPLY)
    }
  })

  it('releases every lease exactly once across all these outcomes', async () => {
    await waitFor('in-flight back to 0', () => api.totalInFlight() === 0, { timeoutMs: 3000 })
    expect(api.released).toBe(api.acquired)
    expect(api.doubleReleases).toBe(0)
  })
})
