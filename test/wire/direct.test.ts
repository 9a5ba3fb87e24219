import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { parse, rawExchange } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'
import {
  errorOf,
  FakeGateway,
  instance,
  lockstep,
  type ProxyHost,
  readFrames,
  type Stub,
  startProxyHost,
  startStub,
  streamFrames,
} from './support.ts'

describe('direct proxy /api/direct/:port/*', () => {
  const api = new FakeGateway()
  let stub: Stub
  let px: ProxyHost
  const stepped = lockstep(streamFrames(5))

  beforeAll(async () => {
    stub = startStub((req, seen) => {
      if (seen.query === '?stream') return stepped.response()
      if (seen.query === '?binary') return new Response(new Uint8Array([0, 255, 1, 254]), { status: 201 })
      return Response.json({ method: req.method, path: seen.path }, { headers: { 'x-engine': 'stub' } })
    })
    api.add(instance('m', stub.port))
    px = await startProxyHost(api)
  })
  afterAll(async () => {
    await px.stop()
    stub.stop()
  })

  it('keeps method, sub-path, query, headers and body', async () => {
    const body = new Uint8Array([123, 34, 97, 34, 58, 32, 49, 125, 0, 200]) // not even valid UTF-8 at the end
    const res = await fetch(`${px.url}/api/direct/${stub.port}/v1/completions?x=1&y=%20two`, {
      method: 'POST',
      headers: { 'x-custom': 'kept', 'content-type': 'application/octet-stream', connection: 'keep-alive' },
      body,
    })
    expect(res.status).toBe(200)
    expect(res.headers.get('x-engine')).toBe('stub')
    expect(await res.json()).toEqual({ method: 'POST', path: '/v1/completions' })
    const seen = stub.seen.at(-1)!
    expect(seen.method).toBe('POST')
    expect(seen.path).toBe('/v1/completions')
    expect(seen.query).toBe('?x=1&y=%20two')
    expect([...seen.body]).toEqual([...body])
    expect(seen.headers['x-custom']).toBe('kept')
    expect(seen.headers['content-type']).toBe('application/octet-stream')
    expect(seen.headers.host).toBe(`127.0.0.1:${stub.port}`)
    await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
  })

  it('drops hop-by-hop request headers, including those named in Connection', async () => {
    const { text: raw } = await rawExchange(
      Number(px.url.slice(px.url.lastIndexOf(':') + 1)),
      `GET /api/direct/${stub.port}/v1/models HTTP/1.1\r\nhost: gateway.example\r\nconnection: keep-alive, x-hop-secret\r\n` +
        'x-hop-secret: 1\r\nkeep-alive: timeout=9\r\nte: trailers\r\nproxy-authorization: Basic Zm9vOmJhcg==\r\n' +
        'x-end-to-end: yes\r\n\r\n',
      { waitMs: 5000, until: (t) => parse(t).length === 1 },
    )
    expect(raw).toContain('200 OK')
    const h = stub.seen.at(-1)!.headers
    expect(h['x-end-to-end']).toBe('yes')
    for (const name of ['x-hop-secret', 'keep-alive', 'te', 'proxy-authorization'])
      expect(h[name]).toBeUndefined()
    expect(h.host).toBe(`127.0.0.1:${stub.port}`)
  })

  it('drops hop-by-hop response headers of the engine', async () => {
    const engine = Bun.listen({
      hostname: '127.0.0.1',
      port: 0,
      socket: {
        data(s) {
          s.write(
            'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive, x-hop\r\nx-hop: 1\r\n' +
              'keep-alive: timeout=5\r\nx-kept: 1\r\nset-cookie: a=1\r\nset-cookie: b=2\r\ncontent-length: 2\r\n\r\n{}',
          )
        },
      },
    })
    api.add(instance('hop', engine.port))
    try {
      const res = await fetch(`${px.url}/api/direct/${engine.port}/v1/models`)
      expect(await res.text()).toBe('{}')
      expect(res.headers.get('x-kept')).toBe('1')
      expect(res.headers.get('x-hop')).toBeNull()
      expect(res.headers.get('keep-alive')).toBeNull()
      expect(res.headers.getSetCookie()).toEqual(['a=1', 'b=2'])
    } finally {
      api.instances.delete('hop')
      engine.stop(true)
    }
  })

  it.each([
    ['GET', '/v1/models'],
    ['POST', '/v1/chat/completions'],
    ['POST', '/v1/embeddings'],
    ['POST', '/tokenize'],
    ['POST', '/v2/rerank'],
  ])('forwards the inference route %s %s', async (method, path) => {
    const res = await fetch(`${px.url}/api/direct/${stub.port}${path}`, { method })
    expect(res.status).toBe(200)
    expect(stub.seen.at(-1)!.method).toBe(method)
    expect(await res.json()).toEqual({ method, path })
  })

  // The engine's control routes (vLLM mounts them without any check in dev mode, which sleep mode
  // needs) are the admin API's, never the inference key's: a key holder must not put an engine to
  // sleep behind the gateway's back or call a worker method.
  it.each([
    ['POST', '/sleep?level=1'],
    ['POST', '/wake_up'],
    ['POST', '/collective_rpc'],
    ['POST', '/reset_prefix_cache'],
    ['GET', '/is_sleeping'],
    ['GET', '/metrics'],
    ['POST', '/v1/load_lora_adapter'],
    ['POST', '/start_profile'],
    ['DELETE', '/v1/chat/completions'],
    ['PUT', '/v1/completions'],
    ['GET', '/v1/chat/completions'],
    ['OPTIONS', '/v1/models'],
    ['GET', ''],
    ['GET', '/'],
    ['GET', '/v1/models/'],
  ])('answers %s %s with 404 and never reaches the engine', async (method, path) => {
    const before = stub.seen.length
    const res = await fetch(`${px.url}/api/direct/${stub.port}${path}`, { method })
    expect(res.status).toBe(404)
    const sub = path.split('?')[0] || '/'
    expect(await errorOf(res)).toEqual({
      message: `The direct proxy forwards an engine's inference routes only, not ${method} ${sub}`,
      type: 'invalid_request_error',
      code: 'not_found',
    })
    expect(stub.seen.length).toBe(before)
  })

  it('returns binary replies and their status as they are', async () => {
    const res = await fetch(`${px.url}/api/direct/${stub.port}/v1/models?binary`)
    expect(res.status).toBe(201)
    expect([...new Uint8Array(await res.arrayBuffer())]).toEqual([0, 255, 1, 254])
  })

  it('pipes streamed replies chunk by chunk', async () => {
    const res = await fetch(`${px.url}/api/direct/${stub.port}/v1/models?stream`)
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8')
    // The engine sends each frame only once the client has the one before (lockstep): each frame
    // reaches the client while the engine has sent it and no more, whole, in order, up to [DONE].
    const sentAt: number[] = []
    const { frames, text } = await readFrames(res, () => {
      sentAt.push(stepped.sent)
      stepped.received()
    })
    expect(frames).toEqual(streamFrames(5))
    expect(text).toBe(streamFrames(5).join(''))
    expect(sentAt).toEqual([1, 2, 3, 4, 5, 6])
    expect(frames.at(-1)).toBe('data: [DONE]\n\n')
    await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
    expect(px.events.at(-1)).toMatchObject({
      instance_id: 'm',
      streamed: true,
      path: `/api/direct/${stub.port}/v1/models`,
    })
  })

  it.each([
    ['an unmanaged port', '1'],
    ['a port out of range', '70000'],
    ['a non-numeric port', 'abc'],
  ])('answers %s with 404 unknown_port in the proxy shape', async (_name, port) => {
    const before = stub.seen.length
    const res = await fetch(`${px.url}/api/direct/${port}/v1/models`)
    expect(res.status).toBe(404)
    expect(await errorOf(res)).toEqual({
      message: `No engine managed by this gateway listens on port ${port}`,
      type: 'invalid_request_error',
      code: 'unknown_port',
    })
    expect(stub.seen.length).toBe(before)
  })

  it('releases every lease exactly once', async () => {
    await waitFor('in-flight back to 0', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
    expect(api.released).toBe(api.acquired)
    expect(api.doubleReleases).toBe(0)
  })
})
