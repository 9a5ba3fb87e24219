import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Server, Socket, TCPSocketListener } from 'bun'
import { Logger } from '../../src/host/logger.ts'
import { createBaseApp, shapeFor } from '../../src/http/app.ts'
import type { FrontOptions } from '../../src/wire/front-options.ts'
import type { ForwardEnd } from '../../src/wire/route.ts'
import { WireFront } from '../../src/wire/server.ts'
import { parse, Raw, rawExchange } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The wire front (src/wire/server.ts) over real sockets: a WireFront on port 0 whose hot route
 * forwards `/v1/*` to a raw-TCP upstream stub (so every reply framing is scripted byte by byte), and
 * whose other requests are relayed to a real Bun.serve framework on a Unix socket (unknown paths go
 * to the base Elysia app, for the real 404 shape). Clients are raw TCP connections: keep-alive,
 * pipelining, 100-continue, refusals, request and reply framings, HEAD and SSE relays, the idle
 * timeout, client aborts reaching the upstream, and stop(false|true).
 */

const count = (n: number) => (text: string) => parse(text).length >= n

// ---- upstream stub (raw TCP: every reply framing by hand) ----
interface UpReq {
  target: string
  headers: Record<string, string>
  body: string
}
interface UpConn {
  buf: Buffer
  closed: boolean
}
const BINARY = Buffer.from(Array.from({ length: 256 }, (_, k) => k))

function reply(s: Socket<UpConn>, req: UpReq): void {
  const path = req.target.split('?')[0]
  const send = (b: string | Uint8Array) =>
    !s.data.closed && s.write(typeof b === 'string' ? Buffer.from(b, 'latin1') : b)
  if (path === '/v1/echo') {
    send(
      `HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: ${req.body.length}\r\n\r\n${req.body}`,
    )
  } else if (path === '/v1/delay') {
    const ms = Number(new URLSearchParams(req.target.split('?')[1]).get('ms'))
    setTimeout(() => send('HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nlate'), ms)
  } else if (path === '/v1/hop') {
    const head = `HTTP/1.1 200 OK\r\nConnection: x-secret, keep-alive\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\nX-Kept: k\r\ncontent-length: 256\r\n\r\n`
    send(Buffer.concat([Buffer.from(head), BINARY]))
  } else if (path === '/v1/chunked') {
    send('HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n')
    setTimeout(() => send('7\r\n, world\r\n0\r\n\r\n'), 30)
  } else if (path === '/v1/204') send('HTTP/1.1 204 No Content\r\nx-n: 1\r\n\r\n')
  else if (path === '/v1/gate')
    void upGate.promise.then(() => send('HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nlate'))
  // /v1/hang never answers.
}

class Upstream {
  requests: UpReq[] = []
  closes = 0
  readonly listener: TCPSocketListener<UpConn>
  constructor() {
    const up = this
    this.listener = Bun.listen<UpConn>({
      hostname: '127.0.0.1',
      port: 0,
      socket: {
        open(s) {
          s.data = { buf: Buffer.alloc(0), closed: false }
        },
        data(s, d) {
          s.data.buf = Buffer.concat([s.data.buf, d])
          for (;;) {
            const text = s.data.buf.toString('latin1')
            const end = text.indexOf('\r\n\r\n')
            if (end < 0) return
            const [line, ...rest] = text.slice(0, end).split('\r\n')
            const headers: Record<string, string> = {}
            for (const l of rest)
              headers[l.slice(0, l.indexOf(':')).toLowerCase()] = l.slice(l.indexOf(':') + 1).trim()
            const len = Number(headers['content-length'] ?? 0)
            if (text.length < end + 4 + len) return
            const req = { target: line!.split(' ')[1]!, headers, body: text.slice(end + 4, end + 4 + len) }
            s.data.buf = s.data.buf.subarray(end + 4 + len)
            up.requests.push(req)
            reply(s, req)
          }
        },
        close(s) {
          s.data.closed = true
          up.closes++
        },
      },
    })
  }
}

// ---- fixture: upstream, framework on a Unix socket, fronts ----
const dir = mkdtempSync(join(tmpdir(), 'wire-front-'))
const fwSocket = join(dir, 'fw.sock')
let up: Upstream
let framework: Server<undefined>
const ends: ForwardEnd[] = []
let sseGate = Promise.withResolvers<boolean>()
/** upGate holds the upstream's answer to /v1/gate until a test resolves it. */
let upGate = Promise.withResolvers<void>()
const fronts: WireFront[] = []

function front(over: Partial<FrontOptions> = {}): WireFront {
  const f = new WireFront({
    name: 'test',
    hostname: '127.0.0.1',
    port: 0,
    idleTimeoutSeconds: 30,
    routes: [
      {
        match: (path) => path.startsWith('/v1/'),
        wire: (req) =>
          req.path === '/v1/leave'
            ? null
            : {
                forward: {
                  origin: `http://127.0.0.1:${up.listener.port}`,
                  target: req.path + req.query,
                  body: req.body,
                  firstByteTimeoutMs: 10_000,
                  connectTimeoutMs: 2000,
                  onEnd: (info) => ends.push(info),
                },
              },
      },
    ],
    frameworkSocket: fwSocket,
    shapeOf: shapeFor,
    onRequest: () => {},
    ...over,
  })
  fronts.push(f)
  return f
}
let main: WireFront
/** Requests that reached the framework (a refusal by the front must leave it unchanged). */
let fwHits = 0
const REQ = (method: string, target: string, extra = '', version = 'HTTP/1.1') =>
  `${method} ${target} ${version}\r\nHost: gw.test\r\n${extra}\r\n`

beforeAll(() => {
  up = new Upstream()
  const base = createBaseApp({ name: 'fw', auth: null, log: new Logger('error', 'test', 'text', () => {}) })
  framework = Bun.serve({
    unix: fwSocket,
    async fetch(req) {
      fwHits++
      const path = new URL(req.url).pathname
      if (path === '/api/hello') return new Response('hello framework', { headers: { 'x-fw': '1' } })
      if (path === '/api/echo')
        return new Response(
          `${req.headers.get('host')}|${req.headers.get('x-modelgate-peer')}|${await req.text()}`,
        )
      if (path === '/v1/leave') return new Response('framework took it')
      if (path === '/api/events') {
        const enc = new TextEncoder()
        // The second event waits for the test to open the gate, or for the stream to be cancelled
        // (the client went), never for time to pass.
        const gate = sseGate
        return new Response(
          new ReadableStream({
            async start(c) {
              c.enqueue(enc.encode('data: 1\n\n'))
              if (!(await gate.promise)) return
              c.enqueue(enc.encode('data: 2\n\n'))
              c.close()
            },
            cancel() {
              gate.resolve(false)
            },
          }),
          { headers: { 'content-type': 'text/event-stream' } },
        )
      }
      return base.handle(req)
    },
  })
  main = front()
})
afterAll(() => {
  for (const f of fronts) f.stop(true)
  framework?.stop(true)
  up?.listener.stop(true)
  rmSync(dir, { recursive: true, force: true })
})

describe('wire front: connections', () => {
  it('keeps a connection alive across requests, closes on Connection: close and on HTTP/1.0', async () => {
    const c = await Raw.open(main.port)
    c.write(REQ('GET', '/api/hello'))
    expect(await c.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    c.write(REQ('POST', '/v1/echo', 'Content-Length: 3\r\n') + 'abc')
    expect(await c.waitFor((r) => parse(r.text).length === 2, 2000)).toBe(true)
    expect(parse(c.text).map((r) => [r.status, r.body])).toEqual([
      [200, 'hello framework'],
      [200, 'abc'],
    ])
    expect(c.closed).toBe(false)
    c.write(REQ('GET', '/api/hello', 'Connection: close\r\n'))
    expect(await c.waitFor((r) => r.closed, 2000)).toBe(true)
    const last = parse(c.text)[2]!
    expect([last.status, last.headers.connection, last.body]).toEqual([200, 'close', 'hello framework'])

    for (const bytes of [REQ('GET', '/api/hello', '', 'HTTP/1.0'), 'GET /v1/echo HTTP/1.0\r\n\r\n']) {
      const r10 = await rawExchange(main.port, bytes, { waitMs: 2000 })
      expect(r10.closed).toBe(true)
      expect(parse(r10.text).map((r) => [r.status, r.headers.connection])).toEqual([[200, 'close']])
    }
  })

  // The relay speaks HTTP/1.1 to the framework: an HTTP/1.0 request without Host gets one.
  it('relays an HTTP/1.0 request without Host to the framework', async () => {
    const r10 = await rawExchange(main.port, 'GET /api/hello HTTP/1.0\r\n\r\n', { waitMs: 2000 })
    expect(parse(r10.text).map((r) => [r.status, r.body])).toEqual([[200, 'hello framework']])
  })

  it('answers pipelined requests (hot and relayed) in order', async () => {
    const bytes =
      REQ('GET', '/v1/delay?ms=150') +
      REQ('POST', '/api/echo', 'Content-Length: 4\r\n') +
      'mid!' +
      REQ('POST', '/v1/echo', 'Content-Length: 5\r\n') +
      'third'
    const { text } = await rawExchange(main.port, bytes, { waitMs: 3000, until: count(3) })
    expect(parse(text).map((r) => [r.status, r.body])).toEqual([
      [200, 'late'],
      // The framework sees a canonical Host and the client's address, never the client's Host.
      [200, 'localhost|127.0.0.1|mid!'],
      [200, 'third'],
    ])
  })

  it('sends 100 Continue before the body is sent, then the response', async () => {
    const c = await Raw.open(main.port)
    c.write(REQ('POST', '/v1/echo', 'Expect: 100-continue\r\nContent-Length: 5\r\n'))
    expect(await c.waitFor((r) => r.text.length > 0, 2000)).toBe(true)
    expect(c.text).toBe('HTTP/1.1 100 Continue\r\n\r\n')
    c.write('later')
    expect(await c.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    expect(parse(c.text)[0]!.body).toBe('later')
    expect(up.requests.at(-1)!.headers.expect).toBeUndefined()
    c.socket.terminate()
  })
})

describe('wire front: refusals', () => {
  const refuse = async (bytes: string) => {
    const r = await rawExchange(main.port, bytes, { waitMs: 2000 })
    expect(r.closed).toBe(true)
    const [res, ...more] = parse(r.text)
    expect(more).toHaveLength(0)
    expect(res!.headers.connection).toBe('close')
    return { status: res!.status, body: JSON.parse(res!.body) }
  }

  it('refuses malformed requests with the controller shape off /v1 and closes', async () => {
    expect(
      await refuse(REQ('POST', '/api/x', 'Content-Length: 1\r\nTransfer-Encoding: chunked\r\n')),
    ).toEqual({
      status: 400,
      body: {
        error: { code: 'BAD_REQUEST', message: 'both Content-Length and Transfer-Encoding', statusCode: 400 },
      },
    })
    const huge = `GET /api/x HTTP/1.1\r\nHost: a\r\nX-Big: ${'a'.repeat(70_000)}\r\n\r\n`
    expect(await refuse(huge)).toEqual({
      status: 431,
      body: { error: { code: 'HEADERS_TOO_LARGE', message: 'request head too large', statusCode: 431 } },
    })
    expect(await refuse(REQ('GET', '/api/x', '', 'HTTP/2.0'))).toEqual({
      status: 505,
      body: {
        error: { code: 'HTTP_VERSION_NOT_SUPPORTED', message: 'unsupported HTTP version', statusCode: 505 },
      },
    })
  })

  it('refuses a bad chunked body under /v1 with the proxy shape', async () => {
    expect(await refuse(REQ('POST', '/v1/echo', 'Transfer-Encoding: chunked\r\n') + 'zz\r\n')).toEqual({
      status: 400,
      body: { error: { message: 'missing chunk size', type: 'invalid_request_error', code: 'BAD_REQUEST' } },
    })
  })

  // A refusal before the request line is read (a head over the limit) takes the shape of its own
  // path, not the previous request's on the connection.
  it('refuses a huge head after a /v1 request in the shape of its own path', async () => {
    const c = await Raw.open(main.port)
    c.write(REQ('GET', '/v1/echo'))
    expect(await c.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    c.write(`GET /api/x HTTP/1.1\r\nHost: a\r\nX-Big: ${'a'.repeat(70_000)}\r\n\r\n`)
    expect(await c.waitFor((r) => r.closed, 2000)).toBe(true)
    expect(JSON.parse(parse(c.text)[1]!.body)).toEqual({
      error: { code: 'HEADERS_TOO_LARGE', message: 'request head too large', statusCode: 431 },
    })
  })

  // Refusals found while parsing the head are rendered in the shape of the request line's path.
  it('refuses a malformed head under /v1 with the proxy shape', async () => {
    expect(
      await refuse(REQ('POST', '/v1/echo', 'Content-Length: 1\r\nTransfer-Encoding: chunked\r\n')),
    ).toEqual({
      status: 400,
      body: {
        error: {
          message: 'both Content-Length and Transfer-Encoding',
          type: 'invalid_request_error',
          code: 'BAD_REQUEST',
        },
      },
    })
  })
})

describe('wire front: request and reply framing', () => {
  it('forwards a chunked request body decoded, with a Content-Length', async () => {
    const body = '5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n'
    const { text } = await rawExchange(
      main.port,
      REQ('POST', '/v1/echo', 'Transfer-Encoding: chunked\r\n') + body,
      {
        waitMs: 2000,
        until: count(1),
      },
    )
    expect(parse(text)[0]!.body).toBe('hello world')
    const got = up.requests.at(-1)!
    expect([got.headers['content-length'], got.headers['transfer-encoding'], got.body]).toEqual([
      '11',
      undefined,
      'hello world',
    ])
  })

  it('relays a Content-Length reply byte for byte, without the hop-by-hop headers', async () => {
    const echo = Buffer.concat([
      Buffer.from(REQ('POST', '/v1/echo', 'Content-Length: 256\r\n'), 'latin1'),
      BINARY,
    ])
    const e = await rawExchange(main.port, echo, { waitMs: 2000, until: count(1) })
    expect(Buffer.from(parse(e.text)[0]!.body, 'latin1').equals(BINARY)).toBe(true)

    const bytes = REQ('GET', '/v1/hop') + REQ('GET', '/v1/hop', 'Connection: close\r\n')
    const { text, closed } = await rawExchange(main.port, bytes, { waitMs: 2000 })
    expect(closed).toBe(true)
    const res = parse(text)
    expect(res).toHaveLength(2)
    for (const r of res) {
      expect(Buffer.from(r.body, 'latin1').equals(BINARY)).toBe(true)
      expect([r.headers['x-secret'], r.headers['keep-alive'], r.headers['x-kept']]).toEqual([
        undefined,
        undefined,
        'k',
      ])
    }
    expect([res[0]!.headers.connection, res[1]!.headers.connection]).toEqual([undefined, 'close'])
  })

  it('re-frames a chunked reply: chunked to HTTP/1.1, close-delimited to HTTP/1.0', async () => {
    const r11 = await rawExchange(main.port, REQ('GET', '/v1/chunked') + REQ('GET', '/v1/204'), {
      waitMs: 2000,
      until: count(2),
    })
    const [a, b] = parse(r11.text)
    expect([a!.status, a!.headers['transfer-encoding'], a!.body]).toEqual([200, 'chunked', 'hello, world'])
    expect(r11.text.endsWith('HTTP/1.1 204 No Content\r\nx-n: 1\r\n\r\n')).toBe(true)
    expect([b!.status, b!.body, b!.headers['content-length']]).toEqual([204, '', undefined])

    const r10 = await rawExchange(main.port, 'GET /v1/chunked HTTP/1.0\r\nConnection: keep-alive\r\n\r\n', {
      waitMs: 2000,
    })
    expect(r10.closed).toBe(true)
    const [c, ...more] = parse(r10.text)
    expect(more).toHaveLength(0)
    expect([c!.headers['transfer-encoding'], c!.headers['content-length'], c!.headers.connection]).toEqual([
      undefined,
      undefined,
      'close',
    ])
    expect(c!.body).toBe('hello, world')
  })
})

describe('wire front: relays to the framework', () => {
  it('relays HEAD without a body, then the next request on the connection', async () => {
    const { text } = await rawExchange(main.port, REQ('HEAD', '/api/hello') + REQ('GET', '/api/hello'), {
      waitMs: 2000,
      until: (t) => parse(t, [true]).length >= 2,
    })
    const [h, g] = parse(text, [true])
    expect([h!.status, h!.headers['content-length'], h!.headers['x-fw'], h!.body]).toEqual([
      200,
      '15',
      '1',
      '',
    ])
    expect([g!.status, g!.body]).toEqual([200, 'hello framework'])
  })

  it('relays an event stream as it streams', async () => {
    sseGate = Promise.withResolvers<boolean>()
    const c = await Raw.open(main.port)
    c.write(REQ('GET', '/api/events'))
    expect(await c.waitFor((r) => r.text.includes('data: 1\n\n'), 2000)).toBe(true)
    expect(c.text).not.toContain('data: 2')
    sseGate.resolve(true)
    expect(await c.waitFor((r) => r.text.endsWith('0\r\n\r\n'), 2000)).toBe(true)
    const [res] = parse(c.text)
    expect([res!.headers['content-type'], res!.body]).toEqual(['text/event-stream', 'data: 1\n\ndata: 2\n\n'])
    c.socket.terminate()
  })

  it("returns the framework's own 404 and a hot path the route leaves to it", async () => {
    const { text } = await rawExchange(main.port, REQ('GET', '/api/nope') + REQ('GET', '/v1/leave'), {
      waitMs: 2000,
      until: count(2),
    })
    const [nf, left] = parse(text)
    expect([nf!.status, JSON.parse(nf!.body)]).toEqual([
      404,
      { error: { code: 'NOT_FOUND', message: 'No route for GET /api/nope', statusCode: 404 } },
    ])
    expect([left!.status, left!.body]).toEqual([200, 'framework took it'])
  })
})

describe('wire front: timeouts, aborts, stop', () => {
  // Bun's socket timeouts have a 4 s granularity: `idleTimeoutSeconds: 1` fires after 1 to 5 s. The
  // upstream answers the busy connection once the idle one is closed: the timer fired for both.
  it('closes an idle connection, but not one whose response is still running', async () => {
    const f = front({ idleTimeoutSeconds: 1 })
    upGate = Promise.withResolvers<void>()
    const t0 = performance.now()
    const idle = await Raw.open(f.port)
    const busy = await Raw.open(f.port)
    busy.write(REQ('GET', '/v1/gate'))
    expect(await idle.waitFor((r) => r.closed, 9000)).toBe(true)
    expect(performance.now() - t0).toBeGreaterThan(900)
    upGate.resolve()
    expect(await busy.waitFor((r) => parse(r.text).length === 1, 6000)).toBe(true)
    expect(parse(busy.text)[0]!.body).toBe('late')
    expect(busy.closed).toBe(false)
    busy.socket.terminate()
  }, 20_000)

  it('a client going away closes its upstream connection', async () => {
    const c = await Raw.open(main.port)
    const closes = up.closes
    const seen = up.requests.length
    c.write(REQ('POST', '/v1/hang', 'Content-Length: 2\r\n') + '{}')
    await waitFor('the request to reach the upstream', () => up.requests.length > seen, { timeoutMs: 2000 })
    expect(up.requests.at(-1)!.target).toBe('/v1/hang')
    c.socket.terminate()
    await waitFor('the upstream connection to close', () => up.closes > closes, { timeoutMs: 3000 })
    expect(up.closes).toBe(closes + 1)
    expect(ends.at(-1)).toMatchObject({ status: 499, aborted: true })
  })

  it('stop(false) closes idle connections at once and busy ones after their response', async () => {
    const f = front()
    const idle = await Raw.open(f.port)
    idle.write(REQ('GET', '/api/hello'))
    expect(await idle.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    const busy = await Raw.open(f.port)
    const seen = up.requests.length
    busy.write(REQ('GET', '/v1/delay?ms=400'))
    await waitFor('the busy request to reach the upstream', () => up.requests.length > seen, {
      timeoutMs: 2000,
    })
    const t0 = performance.now()
    f.stop(false)
    expect(await idle.waitFor((r) => r.closed, 200)).toBe(true)
    expect(busy.closed).toBe(false)
    expect(await busy.waitFor((r) => r.closed, 2000)).toBe(true)
    expect(performance.now() - t0).toBeGreaterThan(200)
    const [late] = parse(busy.text)
    expect([late!.status, late!.body]).toEqual([200, 'late'])
    // Its head was written after the stop began: it tells the client not to reuse the connection.
    expect(late!.headers.connection).toBe('close')
    expect(parse(idle.text)[0]!.headers.connection).toBeUndefined()
    await expect(Raw.open(f.port)).rejects.toThrow()
  })

  it('stop(false) lets a request still arriving finish, and answers it with Connection: close', async () => {
    // The front matches the route as soon as the head is read (for its body limit): that is the event.
    const headRead = Promise.withResolvers<void>()
    const f = front({
      routes: [
        {
          match: (path) => {
            if (path === '/v1/answer') headRead.resolve()
            return path === '/v1/answer'
          },
          wire: () => ({ json: { ok: true } }),
        },
      ],
    })
    const c = await Raw.open(f.port)
    c.write(`${REQ('POST', '/v1/answer', 'Content-Length: 4\r\n')}ab`)
    await headRead.promise
    f.stop(false)
    // Half a request is not cut: the client would lose it without knowing whether it was handled
    // (a cut also leaves the rest below unanswered).
    expect(c.closed).toBe(false)
    c.write('cd')
    expect(await c.waitFor((r) => r.closed, 2000)).toBe(true)
    const rs = parse(c.text)
    expect(rs.map((r) => [r.status, r.headers.connection, r.body])).toEqual([[200, 'close', '{"ok":true}']])
  })

  it('stop(true) closes running connections at once', async () => {
    const f = front()
    const busy = await Raw.open(f.port)
    busy.write(REQ('GET', '/v1/hang'))
    await waitFor('the request to start', () => f.running > 0, { timeoutMs: 2000 })
    f.stop(true)
    expect(await busy.waitFor((r) => r.closed, 200)).toBe(true)
    expect(busy.text).toBe('')
  })
})

describe('wire front: hostile clients', () => {
  const refusal = async (port: number, bytes: string, waitMs = 3000) => {
    const hits = fwHits
    const r = await rawExchange(port, bytes, { waitMs })
    expect(r.closed).toBe(true)
    const [res, ...more] = parse(r.text)
    expect(more).toHaveLength(0)
    expect(res!.headers.connection).toBe('close')
    // Nothing of a refused request reaches the framework.
    expect(fwHits).toBe(hits)
    return { status: res!.status, body: JSON.parse(res!.body) }
  }

  it('answers an unknown or lower-case method 501, a bare-LF head 400, at once', async () => {
    for (const method of ['FOO', 'get', 'TRACE'])
      expect(await refusal(main.port, REQ(method, '/api/hello'))).toEqual({
        status: 501,
        body: {
          error: { code: 'NOT_IMPLEMENTED', message: `method ${method} is not implemented`, statusCode: 501 },
        },
      })
    expect(await refusal(main.port, 'GET /api/hello HTTP/1.1\nHost: a\n\n')).toEqual({
      status: 400,
      body: { error: { code: 'BAD_REQUEST', message: 'bare LF in request head', statusCode: 400 } },
    })
  })

  it('answers a malformed Host 400 in the shape of the path, never 500', async () => {
    for (const host of ['[', '%', 'a:b:c', ':80', '127.0.0.1:99999']) {
      const api = await refusal(main.port, `GET /api/hello HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
      expect(api).toEqual({
        status: 400,
        body: { error: { code: 'BAD_REQUEST', message: 'bad Host', statusCode: 400 } },
      })
      const v1 = await refusal(main.port, `GET /v1/echo HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
      expect(v1.status).toBe(400)
      expect(v1.body.error.type).toBe('invalid_request_error')
    }
  })

  it('relays a short Host as the canonical one, and never a client-sent peer header', async () => {
    const bytes =
      'POST /api/echo HTTP/1.1\r\nHost: a\r\nX-Modelgate-Peer: 10.9.9.9\r\nContent-Length: 2\r\n\r\nhi'
    const r = await rawExchange(main.port, bytes, { waitMs: 2000, until: (t) => parse(t).length === 1 })
    expect(parse(r.text)[0]!.body).toBe('localhost|127.0.0.1|hi')
  })

  it('refuses JSON nested deeper than the limit before the framework parses it', async () => {
    const deep = '['.repeat(65) + ']'.repeat(65)
    const req = (body: string, type = 'Content-Type: application/json\r\n') =>
      `POST /api/echo HTTP/1.1\r\nHost: a\r\n${type}Content-Length: ${body.length}\r\n\r\n${body}`
    expect(await refusal(main.port, req(deep))).toEqual({
      status: 400,
      body: { error: { code: 'BAD_REQUEST', message: 'JSON body nested deeper than 64', statusCode: 400 } },
    })
    // No Content-Type: the framework may still parse it as JSON, so it is checked too.
    expect((await refusal(main.port, req(deep, ''))).status).toBe(400)
    // 20 000 deep (the attack that froze every listener): refused as fast.
    expect((await refusal(main.port, req('['.repeat(20_000)))).status).toBe(400)
    // At the limit, or brackets inside strings, or another content type: relayed.
    const ok = async (body: string, type?: string) => {
      const r = await rawExchange(main.port, req(body, type), {
        waitMs: 2000,
        until: (t) => parse(t).length === 1,
      })
      expect(parse(r.text)[0]!.status).toBe(200)
    }
    await ok('['.repeat(64) + ']'.repeat(64))
    await ok(JSON.stringify({ a: '['.repeat(100), b: '\\"[[[[' }))
    await ok(deep, 'Content-Type: text/plain\r\n')
  })

  it('refuses a relayed body over relayBodyBytes from its head alone (413), not an inference one', async () => {
    const f = front({ front: { relayBodyBytes: 10 } })
    expect(await refusal(f.port, `POST /api/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n`)).toEqual(
      {
        status: 413,
        body: { error: { code: 'PAYLOAD_TOO_LARGE', message: 'request body too large', statusCode: 413 } },
      },
    )
    const body = 'x'.repeat(20)
    const r = await rawExchange(
      f.port,
      REQ('POST', '/v1/echo', `Content-Length: ${body.length}\r\n`) + body,
      {
        waitMs: 2000,
        until: (t) => parse(t).length === 1,
      },
    )
    expect(parse(r.text)[0]!.status).toBe(200)
  })

  it('past maxConnections serves the reserve health only, then closes new connections at once', async () => {
    const f = front({
      front: {
        maxConnections: 2,
        maxUnauthenticated: 2,
        reserveConnections: 1,
        alwaysServe: (p) => p === '/api/hello',
      },
    })
    // Two connections with a request running (a waiting one would make room for a new one).
    upGate = Promise.withResolvers<void>()
    const held = [await Raw.open(f.port), await Raw.open(f.port)]
    for (const c of held) c.write(REQ('GET', '/v1/gate'))
    // Both count once the listener has seen them open and their heads: wait on that, not on time.
    await waitFor('the listener to see both requests', () => f.conns.size >= 2 && f.fresh.size === 0, {
      timeoutMs: 2000,
    })
    expect(f.conns.size).toBe(2)
    // A reserve connection: health is answered (and the connection closed), anything else is 503.
    const health = await rawExchange(f.port, REQ('GET', '/api/hello'), { waitMs: 2000 })
    expect(health.closed).toBe(true)
    expect(parse(health.text)[0]!.status).toBe(200)
    expect((await refusal(f.port, REQ('GET', '/api/echo'))).status).toBe(503)
    // With the reserve taken, one more is closed before anything is read.
    const reserve = await Raw.open(f.port)
    await waitFor('the reserve connection', () => f.overflow >= 1, { timeoutMs: 2000 })
    const rejected = f.rejected
    const extra = await Raw.open(f.port)
    expect(await extra.waitFor((r) => r.closed, 2000)).toBe(true)
    expect(extra.text).toBe('')
    expect(f.rejected).toBe(rejected + 1)
    // The connections already open keep being served.
    upGate.resolve()
    held[0]!.write(REQ('GET', '/api/hello'))
    expect(await held[0]!.waitFor((r) => parse(r.text).length === 2, 2000)).toBe(true)
    expect(parse(held[0]!.text).map((r) => r.status)).toEqual([200, 200])
    for (const c of [...held, reserve]) c.socket.terminate()
  })

  it('cuts a reserve connection that sends no head within two seconds, so the next probe gets the reserve', async () => {
    const f = front({
      front: { maxConnections: 2, reserveConnections: 1, alwaysServe: (p) => p === '/api/hello' },
    })
    // Two connections with a request running (not waiting for a head: nothing to make room with).
    upGate = Promise.withResolvers<void>()
    const busy: Raw[] = []
    for (let i = 0; i < 2; i++) {
      const c = await Raw.open(f.port)
      c.write(REQ('GET', '/v1/gate'))
      busy.push(c)
      await waitFor('the request running', () => f.conns.size > i && f.fresh.size === 0, { timeoutMs: 2000 })
    }
    const silent = await Raw.open(f.port)
    await waitFor('the silent reserve connection', () => f.overflow >= 1, { timeoutMs: 2000 })
    expect(await silent.waitFor((r) => r.closed, 5000)).toBe(true)
    const health = await rawExchange(f.port, REQ('GET', '/api/hello'), { waitMs: 2000 })
    expect(parse(health.text)[0]!.status).toBe(200)
    upGate.resolve()
    for (const c of busy) c.socket.terminate()
  })

  it('a full listener makes room for a new connection by closing an idle keep-alive one', async () => {
    const f = front({ front: { maxConnections: 2, maxUnauthenticated: 2, reserveConnections: 0 } })
    const idle = [await Raw.open(f.port), await Raw.open(f.port)]
    for (const c of idle) {
      c.write(REQ('GET', '/api/hello'))
      expect(await c.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    }
    const fresh = await Raw.open(f.port)
    fresh.write(REQ('GET', '/api/hello'))
    expect(await fresh.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    expect(parse(fresh.text)[0]!.status).toBe(200)
    expect(f.reclaimed).toBe(1)
    await waitFor('one idle connection closed', () => idle.some((c) => c.closed), { timeoutMs: 2000 })
    for (const c of [...idle, fresh]) c.socket.terminate()
  })

  it('connections without a complete head hold at most maxUnauthenticated: the one open longest is cut first', async () => {
    const f = front({ front: { maxConnections: 10, maxUnauthenticated: 2, reserveConnections: 0 } })
    // A head arriving and never finished (Slowloris) counts as much as a silent connection.
    const slow = await Raw.open(f.port)
    slow.write('GET /api/hello HTTP/1.1\r\nHo')
    await waitFor('the slow connection counted', () => f.fresh.size >= 1, { timeoutMs: 2000 })
    const silent = await Raw.open(f.port)
    await waitFor('the silent connection counted', () => f.fresh.size >= 2, { timeoutMs: 2000 })
    const third = await Raw.open(f.port)
    expect(await slow.waitFor((r) => r.closed, 5000)).toBe(true)
    expect(slow.text).toBe('')
    expect(silent.closed).toBe(false)
    const fourth = await Raw.open(f.port)
    expect(await silent.waitFor((r) => r.closed, 5000)).toBe(true)
    // The newest were kept, and are served.
    for (const c of [third, fourth]) {
      c.write(REQ('GET', '/api/hello'))
      expect(await c.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
      expect(parse(c.text)[0]!.status).toBe(200)
    }
    expect(f.shedFresh).toBe(2)
    expect(f.fresh.size).toBe(0)
    for (const c of [third, fourth]) c.socket.terminate()
  })

  it('a full listener cuts whichever connection has waited longest for a head, silent or keep-alive', async () => {
    const f = front({ front: { maxConnections: 2, maxUnauthenticated: 2, reserveConnections: 0 } })
    const silent = await Raw.open(f.port)
    await waitFor('the silent connection counted', () => f.fresh.size >= 1, { timeoutMs: 2000 })
    const served = await Raw.open(f.port)
    served.write(REQ('GET', '/api/hello'))
    expect(await served.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    // The silent one opened before the served one's answer ended: it goes first, then the served one.
    const next = await Raw.open(f.port)
    expect(await silent.waitFor((r) => r.closed, 5000)).toBe(true)
    expect(served.closed).toBe(false)
    const last = await Raw.open(f.port)
    expect(await served.waitFor((r) => r.closed, 5000)).toBe(true)
    expect(served.text.length).toBeGreaterThan(0)
    expect(next.closed).toBe(false)
    expect([f.shedFresh, f.reclaimed]).toEqual([1, 1])
    for (const c of [next, last]) c.socket.terminate()
  })

  it('answers 408 to a head that is not complete within headTimeoutMs (Slowloris)', async () => {
    const f = front({ front: { headTimeoutMs: 200 } })
    const c = await Raw.open(f.port)
    c.write('GET /api/hello HTTP/1.1\r\nHo')
    // A byte now and then does not extend the head's deadline.
    c.write('s')
    expect(await c.waitFor((r) => r.closed, 5000)).toBe(true)
    const [res] = parse(c.text)
    expect(res!.status).toBe(408)
    expect(JSON.parse(res!.body).error.code).toBe('REQUEST_TIMEOUT')
  })

  it('answers 408 to a body arriving below minBodyBytesPerSecond, and not to a running response', async () => {
    const f = front({ front: { headTimeoutMs: 200, minBodyBytesPerSecond: 1_000_000 } })
    const slow = await Raw.open(f.port)
    slow.write(REQ('POST', '/api/echo', 'Content-Length: 100\r\n') + 'x')
    const busy = await Raw.open(f.port)
    // The upstream answers once the sweep that refused the slow body has passed over the busy one too.
    upGate = Promise.withResolvers<void>()
    busy.write(REQ('GET', '/v1/gate'))
    await waitFor('the busy request to start', () => f.running > 0, { timeoutMs: 2000 })
    expect(await slow.waitFor((r) => r.closed, 5000)).toBe(true)
    expect(parse(slow.text)[0]!.status).toBe(408)
    upGate.resolve()
    expect(await busy.waitFor((r) => parse(r.text).length === 1, 5000)).toBe(true)
    expect(parse(busy.text)[0]!.body).toBe('late')
    busy.socket.terminate()
  })

  it('counts running inference requests and resolves drained() when the last one ends', async () => {
    const f = front()
    expect(f.running).toBe(0)
    const c = await Raw.open(f.port)
    upGate = Promise.withResolvers<void>()
    c.write(REQ('GET', '/v1/gate'))
    await waitFor('the request to start', () => f.running > 0, { timeoutMs: 2000 })
    expect(f.running).toBe(1)
    let drained = false
    const done = f.drained().then(() => {
      drained = true
    })
    expect(drained).toBe(false)
    upGate.resolve()
    await done
    expect(f.running).toBe(0)
    // Drained means answered: the response was written before the count fell.
    expect(await c.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    expect(parse(c.text).map((r) => r.body)).toEqual(['late'])
    c.socket.terminate()
  })
})

describe('wire front: deferred decisions', () => {
  it('holds the request while the route decides, then carries out its decision', async () => {
    const gate = Promise.withResolvers<void>()
    const f = front({
      routes: [
        {
          match: (path) => path === '/v1/held',
          wire: () => ({
            defer: async () => {
              await gate.promise
              return { json: { woke: true } }
            },
          }),
        },
      ],
    })
    const c = await Raw.open(f.port)
    c.write(REQ('GET', '/v1/held'))
    await waitFor('the request to be held', () => f.running > 0, { timeoutMs: 2000 })
    // Held: counted for the drain, nothing answered yet.
    expect(f.running).toBe(1)
    expect(c.text).toBe('')
    gate.resolve()
    expect(await c.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    expect(parse(c.text)[0]!.body).toBe('{"woke":true}')
    expect(f.running).toBe(0)
    // The connection goes on serving.
    c.write(REQ('GET', '/api/hello'))
    expect(await c.waitFor((r) => parse(r.text).length === 2, 2000)).toBe(true)
    c.socket.terminate()
  })

  it('aborts the wait when the client leaves, and ends a forward decided after that as 499', async () => {
    const gate = Promise.withResolvers<void>()
    let aborted = false
    const ended: ForwardEnd[] = []
    const f = front({
      routes: [
        {
          match: (path) => path === '/v1/held',
          wire: (req) => ({
            defer: async (signal) => {
              signal.addEventListener('abort', () => {
                aborted = true
              })
              await gate.promise
              return {
                forward: {
                  origin: `http://127.0.0.1:${up.listener.port}`,
                  target: '/v1/echo',
                  body: req.body,
                  firstByteTimeoutMs: 1000,
                  connectTimeoutMs: 1000,
                  onEnd: (info) => ended.push(info),
                },
              }
            },
          }),
        },
      ],
    })
    const c = await Raw.open(f.port)
    const seen = up.requests.length
    c.write(REQ('GET', '/v1/held'))
    await waitFor('the request to be held', () => f.running > 0, { timeoutMs: 2000 })
    c.socket.terminate()
    await waitFor('the wait to be aborted', () => aborted, { timeoutMs: 2000 })
    expect(aborted).toBe(true)
    expect(f.running).toBe(0)
    gate.resolve()
    await waitFor('the late forward to be ended', () => ended.length > 0, { timeoutMs: 2000 })
    expect(ended).toEqual([
      { status: 499, bytes: 0, durationMs: 0, ttftMs: null, streamed: false, aborted: true },
    ])
    // Nothing reached the upstream.
    expect(up.requests.length).toBe(seen)
  })
})
