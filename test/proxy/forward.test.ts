import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Server, Socket } from 'bun'
import { type ForwardEnd, forward } from '../../src/proxy/forward.ts'
import type { Transport } from '../../src/proxy/upstream.ts'
import {
  CHAT_REPLY,
  chatHandler,
  encoder,
  readChunks,
  type Stub,
  sseResponse,
  startStub,
  streamFrames,
  waitFor,
} from './support.ts'

/**
 * forward() on its own (no Host, no gateway), through both transports: the own HTTP/1.1 client
 * ('auto' for http://) and Bun's fetch ('fetch', used for https:// upstreams), which must behave
 * the same to the client.
 */
describe.each(['auto', 'fetch'] as Transport[])('forward with transport %s', (transport) => {
  let stub: Stub
  let proxy: Server<unknown>
  const ends: ForwardEnd[] = []
  let upstream = ''

  beforeAll(() => {
    stub = startStub(chatHandler(6, 15))
    upstream = stub.url
    proxy = Bun.serve({
      hostname: '127.0.0.1',
      port: 0,
      fetch(req, server) {
        const url = new URL(req.url)
        const target = url.searchParams.get('target') ?? upstream
        return forward(req, `${target}${url.pathname}`, {
          server,
          firstByteTimeoutMs: 500,
          connectTimeoutMs: 150,
          transport,
          onEnd: (info) => ends.push(info),
        })
      },
    })
  })
  afterAll(() => {
    proxy.stop(true)
    stub.stop()
  })

  const base = () => `http://127.0.0.1:${proxy.port}`
  const post = (path: string, body: unknown, query = '') =>
    fetch(`${base()}${path}${query}`, { method: 'POST', body: JSON.stringify(body) })

  it('returns a JSON reply with its status and headers, and reports the end once', async () => {
    const before = ends.length
    const res = await post('/v1/chat/completions', { model: 'm' })
    expect(res.status).toBe(200)
    expect(res.headers.get('x-engine')).toBe('stub')
    expect(await res.json()).toEqual(CHAT_REPLY)
    await waitFor(() => ends.length === before + 1, 1000, 'onEnd')
    expect(ends.at(-1)).toMatchObject({ status: 200, streamed: false, aborted: false, ttftMs: null })
    expect(ends.at(-1)!.bytes).toBe(JSON.stringify(CHAT_REPLY).length)
  })

  it('pipes a stream chunk for chunk and reports ttft', async () => {
    const res = await post('/v1/chat/completions', { model: 'm', stream: true })
    expect((await readChunks(res)).chunks).toEqual(streamFrames(6))
    await waitFor(() => ends.at(-1)?.streamed === true, 1000, 'onEnd')
    expect(ends.at(-1)!.ttftMs).toBeGreaterThan(0)
  })

  it('ends a broken event stream with an error event and [DONE]', async () => {
    const engine = Bun.listen({
      hostname: '127.0.0.1',
      port: 0,
      socket: {
        data(s: Socket<undefined>) {
          s.write('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n')
          const frame = encoder.encode('data: {"x":1}\n\n')
          s.write(`${frame.length.toString(16)}\r\n`)
          s.write(frame)
          s.write('\r\n')
          setTimeout(() => s.terminate(), 20)
        },
      },
    })
    try {
      const res = await post('/v1/chat/completions', {}, `?target=http://127.0.0.1:${engine.port}`)
      const frames = (await res.text()).split('\n\n').filter(Boolean)
      expect(frames[0]).toBe('data: {"x":1}')
      expect(JSON.parse(frames[1]!.slice(6)).error.code).toBe('upstream_disconnected')
      expect(frames[2]).toBe('data: [DONE]')
      expect(ends.at(-1)).toMatchObject({ status: 502, error: 'upstream_disconnected', streamed: true })
    } finally {
      engine.stop(true)
    }
  })

  it('aborts the upstream when the client leaves, and reports 499 once', async () => {
    stub.handler = () => sseResponse(streamFrames(500), 10)
    try {
      const before = stub.aborts
      const endsBefore = ends.length
      const ac = new AbortController()
      const res = await fetch(`${base()}/v1/chat/completions`, {
        method: 'POST',
        body: '{}',
        signal: ac.signal,
      })
      const reader = res.body!.getReader()
      await reader.read()
      ac.abort()
      await waitFor(() => stub.aborts > before, 2000, 'the upstream to see the abort')
      await waitFor(() => ends.length === endsBefore + 1, 2000, 'onEnd')
      await Bun.sleep(100)
      expect(ends.length).toBe(endsBefore + 1)
      expect(ends.at(-1)).toMatchObject({ status: 499, aborted: true, streamed: true })
    } finally {
      stub.handler = chatHandler(6, 15)
    }
  })

  it('answers a refused connection with 502 and a silent upstream with 504', async () => {
    const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
    const closed = probe.port
    probe.stop(true)
    const refused = await post('/x', {}, `?target=http://127.0.0.1:${closed}`)
    expect(refused.status).toBe(502)
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe('upstream_unavailable')
    const silent = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
    try {
      const res = await post('/x', {}, `?target=http://127.0.0.1:${silent.port}`)
      expect(res.status).toBe(504)
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('upstream_timeout')
    } finally {
      silent.stop(true)
    }
  })

  it.skipIf(!Bun.which('python3'))(
    'answers an unreachable upstream with 504 upstream_connect_timeout',
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
        const port = Number(new TextDecoder().decode((await py.stdout.getReader().read()).value).trim())
        await Bun.connect({ hostname: '127.0.0.1', port, socket: { data() {} } })
        const res = await post('/x', {}, `?target=http://127.0.0.1:${port}`)
        expect(res.status).toBe(504)
        expect(((await res.json()) as { error: { code: string } }).error.code).toBe(
          'upstream_connect_timeout',
        )
      } finally {
        py.kill()
      }
    },
  )
})
