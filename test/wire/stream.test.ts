import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { Socket, TCPSocketListener } from 'bun'
import { Raw } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'
import {
  CHAT_REPLY,
  chatHandler,
  encoder,
  FakeGateway,
  instance,
  lockstep,
  type ProxyHost,
  postJson,
  readFrames,
  type Stub,
  sseResponse,
  startProxyHost,
  startStub,
  streamFrames,
} from './support.ts'

const msg = { messages: [{ role: 'user', content: 'hi' }] }

/**
 * brokenEngine is a raw TCP engine that starts a chunked SSE reply, sends `frames`, then drops the
 * connection without the terminating chunk: what the client sees when an engine process dies.
 */
function brokenEngine(frames: string[]): TCPSocketListener<undefined> {
  return Bun.listen({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      async data(socket: Socket<undefined>) {
        socket.write(
          'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n',
        )
        for (const f of frames) {
          await Bun.sleep(15)
          const bytes = encoder.encode(f)
          socket.write(`${bytes.length.toString(16)}\r\n`)
          socket.write(bytes)
          socket.write('\r\n')
        }
        await Bun.sleep(15)
        socket.terminate()
      },
    },
  })
}

describe('streaming pass-through', () => {
  const api = new FakeGateway()
  let stub: Stub
  let px: ProxyHost

  beforeAll(async () => {
    stub = startStub()
    api.add(instance('m', stub.port))
    px = await startProxyHost(api, { firstByteTimeoutMs: 800, idleTimeoutSeconds: 1 })
  })
  afterAll(async () => {
    await px.stop()
    stub.stop()
  })

  it('hands every engine chunk on as it arrives, unchanged, with the engine status and headers', async () => {
    const frames = streamFrames(12)
    const stepped = lockstep(frames)
    stub.handler = () => stepped.response()
    const res = await postJson(`${px.url}/v1/chat/completions`, { model: 'm', stream: true, ...msg })
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8')
    expect(res.headers.get('x-engine')).toBe('stub')
    // Not batched: the engine sends each frame only once the client has the one before (lockstep),
    // so each reaches the client while the engine has sent it and no more; whole, in order, unchanged.
    const sentAt: number[] = []
    const { frames: got, text } = await readFrames(res, () => {
      sentAt.push(stepped.sent)
      stepped.received()
    })
    expect(got).toEqual(frames)
    expect(text).toBe(frames.join(''))
    expect(sentAt).toEqual(frames.map((_, i) => i + 1))
    expect(got.at(-1)).toBe('data: [DONE]\n\n')
    await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
    const ev = px.events.at(-1)!
    expect(ev).toMatchObject({
      model: 'm',
      instance_id: 'm',
      status: 200,
      streamed: true,
      path: '/v1/chat/completions',
    })
    expect(ev.ttft_ms).toBeGreaterThan(0)
    expect(ev.duration_ms).toBeGreaterThan(ev.ttft_ms!)
  })

  it('carries a non-200 engine status on a stream', async () => {
    stub.handler = () => {
      const r = sseResponse(streamFrames(2), 5)
      return new Response(r.body, { status: 207, headers: r.headers })
    }
    const res = await postJson(`${px.url}/v1/chat/completions`, { model: 'm', stream: true, ...msg })
    expect(res.status).toBe(207)
    expect(await res.text()).toBe(streamFrames(2).join(''))
  })

  it('aborts the upstream request at once when the client goes away', async () => {
    // The engine sends two frames, then nothing more (it holds until the test ends): the cancel
    // must reach it from the client's going away alone, not on the engine's next write.
    const held = Promise.withResolvers<void>()
    let pulls = 0
    stub.handler = () =>
      sseResponse(streamFrames(1000), 0, async () => {
        if (++pulls > 2) await held.promise
      })
    const before = stub.aborts
    const ac = new AbortController()
    const res = await fetch(`${px.url}/v1/chat/completions`, {
      method: 'POST',
      body: JSON.stringify({ model: 'm', stream: true, ...msg }),
      signal: ac.signal,
    })
    const reader = res.body!.getReader()
    let got = ''
    while (got.split('\n\n').length <= 2) {
      const { done, value } = await reader.read()
      if (done) break
      got += new TextDecoder().decode(value)
    }
    expect(got).toStartWith(streamFrames(2).slice(0, 2).join(''))
    ac.abort()
    try {
      await waitFor('the engine to see the cancel while it sends nothing', () => stub.aborts > before, {
        timeoutMs: 2000,
      })
      // Two frames sent, and at most the third pull, holding: the engine wrote nothing more.
      expect(pulls).toBeLessThanOrEqual(3)
    } finally {
      held.resolve()
    }
    await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
    expect(px.events.at(-1)).toMatchObject({ status: 499, streamed: true })
    expect(api.doubleReleases).toBe(0)
    // A client going away is routine: not a warning (the host logs at warn here).
    expect(px.logs.filter((l) => l.includes(' 499 '))).toEqual([])
  })

  it('treats a client that half-closes after its request as gone, as nginx does', async () => {
    // A FIN is how a proxy learns that a streaming client left; nginx (proxy_ignore_client_abort
    // off) reads it the same way: "client prematurely closed connection".
    stub.handler = () => sseResponse(streamFrames(1000), 20)
    const before = stub.aborts
    const body = JSON.stringify({ model: 'm', stream: true, ...msg })
    const { port } = new URL(px.url)
    let received = ''
    const socket = await Bun.connect({
      hostname: '127.0.0.1',
      port: Number(port),
      socket: {
        data(_s, d) {
          received += d.toString('latin1')
        },
      },
    })
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    )
    await waitFor('the first event', () => received.includes('data: '), { timeoutMs: 2000 })
    socket.shutdown()
    await waitFor('the engine to see the cancel', () => stub.aborts > before, { timeoutMs: 2000 })
    await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
    expect(received.startsWith('HTTP/1.1 200 ')).toBe(true)
    expect(px.events.at(-1)).toMatchObject({ status: 499, streamed: true })
    socket.end()
  })

  it('ends a stream whose engine dies with an error event, then [DONE]', async () => {
    const frames = streamFrames(3).slice(0, 3)
    const engine = brokenEngine(frames)
    api.add(instance('dies', engine.port))
    try {
      const res = await postJson(`${px.url}/v1/chat/completions`, { model: 'dies', stream: true, ...msg })
      expect(res.status).toBe(200)
      const body = await res.text()
      expect(body.startsWith(frames.join(''))).toBe(true)
      const tail = body.slice(frames.join('').length).split('\n\n').filter(Boolean)
      expect(tail).toHaveLength(2)
      expect(JSON.parse(tail[0]!.slice('data: '.length))).toEqual({
        error: {
          message: expect.stringContaining('The model engine stopped before the response ended'),
          type: 'bad_gateway',
          code: 'upstream_disconnected',
        },
      })
      expect(tail[1]).toBe('data: [DONE]')
      await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
      expect(px.events.at(-1)).toMatchObject({ instance_id: 'dies', status: 502, streamed: true })
    } finally {
      api.instances.delete('dies')
      engine.stop(true)
    }
  })

  it('closes a frame cut in half before appending the error event', async () => {
    const engine = brokenEngine(['data: {"id":"x","choi'])
    api.add(instance('half', engine.port))
    try {
      const res = await postJson(`${px.url}/v1/chat/completions`, { model: 'half', stream: true, ...msg })
      const frames = (await res.text()).split('\n\n').filter(Boolean)
      expect(frames[0]).toBe('data: {"id":"x","choi')
      expect(JSON.parse(frames[1]!.slice(6)).error.code).toBe('upstream_disconnected')
      expect(frames[2]).toBe('data: [DONE]')
    } finally {
      api.instances.delete('half')
      engine.stop(true)
    }
  })

  it('reports a stream whose first token misses the first-byte deadline as upstream_timeout in-band', async () => {
    let closed = false
    // Headers at once (as uvicorn sends them), then nothing: a prefill that never ends.
    const engine = Bun.listen({
      hostname: '127.0.0.1',
      port: 0,
      socket: {
        data(socket: Socket<undefined>) {
          socket.write(
            'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n',
          )
        },
        close() {
          closed = true
        },
      },
    })
    api.add(instance('stuck', engine.port))
    try {
      const res = await postJson(`${px.url}/v1/chat/completions`, { model: 'stuck', stream: true, ...msg })
      expect(res.status).toBe(200)
      const frames = (await res.text()).split('\n\n').filter(Boolean)
      expect(JSON.parse(frames[0]!.slice(6))).toEqual({
        error: {
          message: 'The model engine sent nothing within 800 ms',
          type: 'gateway_timeout',
          code: 'upstream_timeout',
        },
      })
      expect(frames[1]).toBe('data: [DONE]')
      await waitFor('the upstream connection to be closed', () => closed, { timeoutMs: 2000 })
      expect(px.events.at(-1)).toMatchObject({ instance_id: 'stuck', status: 504, streamed: true })
    } finally {
      api.instances.delete('stuck')
      engine.stop(true)
    }
  })

  // The front closes connections idle past idle_timeout_seconds (here 1 s; Bun's socket timer ticks
  // every 4 s): a slow token or a long non-streamed generation must not be cut. Each test holds the
  // engine until an idle connection opened beside the running one is closed: the idle timer has then
  // fired for the running connection too (armed no later, on the same listener's tick).
  it('does not let the idle timeout cut a stream that pauses for longer than it', async () => {
    const frames = streamFrames(3)
    const idleFired = Promise.withResolvers<void>()
    stub.handler = () => sseResponse(frames, 0, pauseOnce(1, idleFired.promise))
    const res = await postJson(`${px.url}/v1/chat/completions`, { model: 'm', stream: true, ...msg })
    const reader = res.body!.getReader()
    const decoder = new TextDecoder()
    let text = decoder.decode((await reader.read()).value, { stream: true })
    await idleConnectionClosed(px.url)
    idleFired.resolve()
    for (let r = await reader.read(); !r.done; r = await reader.read()) text += decoder.decode(r.value)
    expect(text).toBe(frames.join(''))
  }, 15_000)

  // The direct proxy's GET catches a regression where the timeout applied to a GET whose handler is
  // still waiting, and not to a POST whose body was read.
  it('does not let the idle timeout cut a long non-streamed reply (POST and GET)', async () => {
    const idleFired = Promise.withResolvers<void>()
    stub.handler = async () => {
      await idleFired.promise
      return Response.json(CHAT_REPLY)
    }
    const slow = await startProxyHost(api, { firstByteTimeoutMs: 20_000, idleTimeoutSeconds: 1 })
    try {
      const seen = stub.seen.length
      const replies = Promise.all([
        postJson(`${slow.url}/v1/chat/completions`, { model: 'm', ...msg }),
        fetch(`${slow.url}/api/direct/${stub.port}/v1/models`),
      ])
      await waitFor('both requests to reach the engine', () => stub.seen.length >= seen + 2)
      await idleConnectionClosed(slow.url)
      idleFired.resolve()
      const [post, get] = await replies
      expect(post.status).toBe(200)
      expect(await post.json()).toEqual(CHAT_REPLY)
      expect(get.status).toBe(200)
      expect(await get.json()).toEqual(CHAT_REPLY)
    } finally {
      await slow.stop()
      stub.handler = chatHandler()
    }
  }, 15_000)

  it('pauses a fast engine while the client does not read, and resumes when it does', async () => {
    let pulls = 0
    let lastPull = performance.now()
    const big = encoder.encode(`data: ${'x'.repeat(65_000)}\n\n`)
    stub.handler = () =>
      new Response(
        new ReadableStream<Uint8Array>(
          {
            pull(c) {
              pulls++
              lastPull = performance.now()
              c.enqueue(big)
            },
          },
          { highWaterMark: 0 },
        ),
        { headers: { 'content-type': 'text/event-stream' } },
      )
    const before = stub.aborts
    const ac = new AbortController()
    const res = await fetch(`${px.url}/v1/chat/completions`, {
      method: 'POST',
      body: JSON.stringify({ model: 'm', stream: true, ...msg }),
      signal: ac.signal,
    })
    const reader = res.body!.getReader()
    try {
      await reader.read()
      // Wait until the engine stops being pulled: the buffers between it and the client are full.
      await waitFor(
        'the engine to stop being pulled (no pull for 200 ms)',
        () => performance.now() - lastPull > 200,
        {
          timeoutMs: 6000,
          show: () => ({ pulls }),
        },
      )
      const settled = pulls
      // An absence, watched over events rather than a pause: a whole second stream runs through the
      // same front and engine while this one is held (both event loops turn for each of its frames),
      // and the held engine is not pulled again meanwhile, since nobody reads.
      stub.handler = chatHandler(20)
      const other = await postJson(`${px.url}/v1/chat/completions`, { model: 'm', stream: true, ...msg })
      expect(other.status).toBe(200)
      expect((await readFrames(other)).frames).toEqual(streamFrames(20))
      // Bounded by kernel socket buffers on two hops (a few MB each), not growing any more.
      expect(settled).toBeLessThan(600)
      expect(pulls - settled).toBeLessThanOrEqual(16)
      // Reading again resumes the engine.
      for (let i = 0; i < 2000 && pulls <= settled + 5; i++) await reader.read()
      expect(pulls).toBeGreaterThan(settled + 5)
    } finally {
      ac.abort()
    }
    await waitFor('the engine to see the cancel', () => stub.aborts > before, { timeoutMs: 2000 })
    await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
  })

  it('releases every lease exactly once', async () => {
    stub.handler = chatHandler()
    await waitFor('in-flight back to 0', () => api.totalInFlight() === 0, { timeoutMs: 3000 })
    expect(api.released).toBe(api.acquired)
    expect(api.doubleReleases).toBe(0)
  })
})

/** pauseOnce: an onPull hook that holds the stream once, before the `at`-th frame, until `until` settles. */
function pauseOnce(at: number, until: Promise<void>): () => Promise<void> {
  let n = 0
  return async () => {
    if (n++ === at) await until
  }
}

/**
 * idleConnectionClosed opens a connection that sends nothing and resolves when the front's idle
 * timeout closes it (1 s configured, Bun's 4 s timer tick: at most ~5 s).
 */
async function idleConnectionClosed(url: string): Promise<void> {
  const idle = await Raw.open(Number(new URL(url).port))
  await idle.waitFor((r) => r.closed, 10_000, 'the idle timeout to close an idle connection')
}
