import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Server, Socket, TCPSocketListener } from 'bun'
import { Logger } from '../../../src/host/logger.ts'
import { createBaseApp, shapeFor } from '../../../src/http/app.ts'
import { type FrontOptions, WireFront } from '../../../src/http/wire/server.ts'
import type { ForwardEnd } from '../../../src/proxy/forward.ts'

/**
 * The wire front (src/http/wire/server.ts) over real sockets: a WireFront on port 0 whose hot route
 * forwards `/v1/*` to a raw-TCP upstream stub (so every reply framing is scripted byte by byte), and
 * whose other requests are relayed to a real Bun.serve framework on a Unix socket (unknown paths go
 * to the base Elysia app, for the real 404 shape). Clients are raw TCP connections: keep-alive,
 * pipelining, 100-continue, refusals, request and reply framings, HEAD and SSE relays, the idle
 * timeout, client aborts reaching the upstream, and stop(false|true).
 */

// ---- raw client ----
class Raw {
  buf = Buffer.alloc(0)
  closed = false
  socket!: Socket<Raw>
  private wake: () => void = () => {}

  static async open(port: number): Promise<Raw> {
    const r = new Raw()
    const on = (s: Socket<Raw>) => {
      s.data.closed = true
      s.data.wake()
    }
    r.socket = await Bun.connect<Raw>({
      hostname: '127.0.0.1',
      port,
      data: r,
      socket: {
        data(s, d) {
          s.data.buf = Buffer.concat([s.data.buf, d])
          s.data.wake()
        },
        close: on,
        error: on,
      },
    })
    return r
  }
  get text(): string {
    return this.buf.toString('latin1')
  }
  write(b: string | Uint8Array): void {
    this.socket.write(typeof b === 'string' ? Buffer.from(b, 'latin1') : b)
  }
  /** waitFor: true once pred holds, false at the deadline. */
  async waitFor(pred: (r: Raw) => boolean, ms: number): Promise<boolean> {
    const deadline = performance.now() + ms
    while (!pred(this)) {
      const left = deadline - performance.now()
      if (left <= 0) return false
      const woke = new Promise<void>((res) => {
        this.wake = res
      })
      await Promise.race([woke, Bun.sleep(Math.min(left, 50))])
    }
    return true
  }
}

/** rawExchange writes bytes on a new connection and collects the reply until it closes, `until` holds, or waitMs. */
async function rawExchange(
  port: number,
  bytes: string | Uint8Array,
  opts: { waitMs: number; until?: (text: string) => boolean },
): Promise<{ text: string; closed: boolean }> {
  const r = await Raw.open(port)
  r.write(bytes)
  await r.waitFor((c) => c.closed || (opts.until?.(c.text) ?? false), opts.waitMs)
  const out = { text: r.text, closed: r.closed }
  r.socket.terminate()
  return out
}

interface Res {
  status: number
  head: string
  headers: Record<string, string>
  body: string
}
/** parse splits raw bytes (latin1) into the complete responses; bodies by length, chunked, or to the end. */
function parse(text: string, headOnly: boolean[] = []): Res[] {
  const out: Res[] = []
  let i = 0
  while (i < text.length) {
    const end = text.indexOf('\r\n\r\n', i)
    if (end < 0) break
    const head = text.slice(i, end)
    const lines = head.split('\r\n')
    const status = Number(lines[0]!.split(' ')[1])
    const headers: Record<string, string> = {}
    for (const l of lines.slice(1)) {
      const c = l.indexOf(':')
      const name = l.slice(0, c).toLowerCase()
      headers[name] = headers[name] ? `${headers[name]}, ${l.slice(c + 1).trim()}` : l.slice(c + 1).trim()
    }
    i = end + 4
    let body = ''
    if (status >= 200 && status !== 204 && status !== 304 && !headOnly[out.length]) {
      if (headers['transfer-encoding'] === 'chunked') {
        for (;;) {
          const eol = text.indexOf('\r\n', i)
          const n = Number.parseInt(text.slice(i, eol), 16)
          if (eol < 0 || Number.isNaN(n) || text.length < eol + 4 + n) return out // incomplete
          i = eol + 2
          if (n === 0) {
            i += 2
            break
          }
          body += text.slice(i, i + n)
          i += n + 2
        }
      } else if (headers['content-length'] !== undefined) {
        const n = Number(headers['content-length'])
        if (text.length < i + n) return out
        body = text.slice(i, i + n)
        i += n
      } else {
        body = text.slice(i)
        i = text.length
      }
    }
    if (status >= 200) out.push({ status, head, headers, body })
  }
  return out
}
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
let sseGate = Promise.withResolvers<void>()
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
const REQ = (method: string, target: string, extra = '', version = 'HTTP/1.1') =>
  `${method} ${target} ${version}\r\nHost: gw.test\r\n${extra}\r\n`

beforeAll(() => {
  up = new Upstream()
  const base = createBaseApp({ name: 'fw', auth: null, log: new Logger('error', 'test', 'text', () => {}) })
  framework = Bun.serve({
    unix: fwSocket,
    async fetch(req) {
      const path = new URL(req.url).pathname
      if (path === '/api/hello') return new Response('hello framework', { headers: { 'x-fw': '1' } })
      if (path === '/api/echo') return new Response(`${req.headers.get('host')}|${await req.text()}`)
      if (path === '/v1/leave') return new Response('framework took it')
      if (path === '/api/events') {
        const enc = new TextEncoder()
        return new Response(
          new ReadableStream({
            async start(c) {
              c.enqueue(enc.encode('data: 1\n\n'))
              await Promise.race([sseGate.promise, Bun.sleep(3000)])
              c.enqueue(enc.encode('data: 2\n\n'))
              c.close()
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
      [200, 'gw.test|mid!'],
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
    sseGate = Promise.withResolvers<void>()
    const c = await Raw.open(main.port)
    c.write(REQ('GET', '/api/events'))
    expect(await c.waitFor((r) => r.text.includes('data: 1\n\n'), 2000)).toBe(true)
    expect(c.text).not.toContain('data: 2')
    sseGate.resolve()
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
  // Bun's socket timeouts have a 4 s granularity: `idleTimeoutSeconds: 1` fires after ~4 s.
  it('closes an idle connection, but not one whose response is still running', async () => {
    const f = front({ idleTimeoutSeconds: 1 })
    const t0 = performance.now()
    const idle = await Raw.open(f.port)
    const busy = await Raw.open(f.port)
    busy.write(REQ('GET', '/v1/delay?ms=4500'))
    expect(await idle.waitFor((r) => r.closed, 9000)).toBe(true)
    expect(performance.now() - t0).toBeGreaterThan(900)
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
    const deadline = performance.now() + 2000
    while (up.requests.length === seen && performance.now() < deadline) await Bun.sleep(10)
    expect(up.requests.at(-1)!.target).toBe('/v1/hang')
    c.socket.terminate()
    while (up.closes === closes && performance.now() < deadline + 1000) await Bun.sleep(10)
    expect(up.closes).toBe(closes + 1)
    expect(ends.at(-1)).toMatchObject({ status: 499, aborted: true })
  })

  it('stop(false) closes idle connections at once and busy ones after their response', async () => {
    const f = front()
    const idle = await Raw.open(f.port)
    idle.write(REQ('GET', '/api/hello'))
    expect(await idle.waitFor((r) => parse(r.text).length === 1, 2000)).toBe(true)
    const busy = await Raw.open(f.port)
    busy.write(REQ('GET', '/v1/delay?ms=400'))
    await Bun.sleep(100)
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
    const f = front({
      routes: [{ match: (path) => path === '/v1/answer', wire: () => ({ json: { ok: true } }) }],
    })
    const c = await Raw.open(f.port)
    c.write(`${REQ('POST', '/v1/answer', 'Content-Length: 4\r\n')}ab`)
    await Bun.sleep(50)
    f.stop(false)
    await Bun.sleep(100)
    // Half a request is not cut: the client would lose it without knowing whether it was handled.
    expect(c.closed).toBe(false)
    c.write('cd')
    expect(await c.waitFor((r) => r.closed, 2000)).toBe(true)
    const rs = parse(c.text)
    expect(rs.map((r) => [r.status, r.headers.connection, r.body])).toEqual([[200, 'close', '{"ok":true}']])
  })

  it('stop(true) closes running connections at once', async () => {
    const f = front()
    const busy = await Raw.open(f.port)
    busy.write(REQ('GET', '/v1/delay?ms=1000'))
    await Bun.sleep(100)
    f.stop(true)
    expect(await busy.waitFor((r) => r.closed, 200)).toBe(true)
    expect(busy.text).toBe('')
  })
})
