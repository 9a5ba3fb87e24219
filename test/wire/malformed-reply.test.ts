import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { Raw, rawExchange } from '../support/raw-client.ts'
import { type RawHttpServer, rawHttpServer } from '../support/raw-http.ts'
import { waitFor } from '../support/wait.ts'
import { FakeGateway, instance, type ProxyHost, startProxyHost } from './support.ts'

/**
 * Issue 16: a malicious or broken engine must not be able to inject headers into the client's
 * response or leave the client hanging. Through real sockets, on the one proxy path (the wire
 * front's WireExchange, which the gateway and the router share), an engine reply whose head is not
 * clean HTTP/1.1 is refused
 * with a 502 `bad_gateway` in the proxy shape, nothing of it reaches the client, and the engine
 * connection is closed rather than pooled.
 */

const BODY = 'ENGINE-BODY'
const JSON_HEAD = 'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n'

/** Engine replies to refuse; each carries an `x-a` header and the body BODY the client must not see. */
const BAD: [string, string][] = [
  ['a bare LF in a header value', `${JSON_HEAD}x-a: a\nX-Injected: yes\r\ncontent-length: 11\r\n\r\n${BODY}`],
  ['a bare CR in a header value', `${JSON_HEAD}x-a: a\rX-Injected: yes\r\ncontent-length: 11\r\n\r\n${BODY}`],
  ['a NUL in a header value', `${JSON_HEAD}x-a: a\0X-Injected: yes\r\ncontent-length: 11\r\n\r\n${BODY}`],
  // The engine keeps the connection open: read as chunked, this reply used to hang the client.
  ['Transfer-Encoding: xchunked', `${JSON_HEAD}x-a: 1\r\ntransfer-encoding: xchunked\r\n\r\n${BODY}`],
  [
    'Transfer-Encoding: gzip, chunked',
    `${JSON_HEAD}x-a: 1\r\ntransfer-encoding: gzip, chunked\r\n\r\nb\r\n${BODY}\r\n0\r\n\r\n`,
  ],
  [
    'both Content-Length and Transfer-Encoding',
    `${JSON_HEAD}x-a: 1\r\ncontent-length: 11\r\ntransfer-encoding: chunked\r\n\r\nb\r\n${BODY}\r\n0\r\n\r\n`,
  ],
  ['an obs-fold line', `${JSON_HEAD}x-a: 1\r\n X-Injected: yes\r\ncontent-length: 11\r\n\r\n${BODY}`],
  ['whitespace before a colon', `${JSON_HEAD}x-a : 1\r\ncontent-length: 11\r\n\r\n${BODY}`],
  // No CRLFCRLF ever comes; the engine keeps the connection open.
  ['a head with bare-LF line ends', `HTTP/1.1 200 OK\nx-a: 1\nX-Injected: yes\n\n${BODY}`],
  // An event stream's head would be written at once: it must be checked before that too.
  [
    'a bare LF in an event stream head',
    `HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-a: a\nX-Injected: yes\r\ntransfer-encoding: chunked\r\n\r\nb\r\n${BODY}\r\n`,
  ],
]

/** The engine answers each request with `reply.bytes`, leaving the connection open. */
const reply = { bytes: '' }

/** sendRaw sends one request with `Connection: close` and returns every byte of the answer, latin1. */
async function sendRaw(port: number, path: string): Promise<string> {
  const body = '{"model":"bad","messages":[]}'
  const { text, closed } = await rawExchange(
    port,
    `POST ${path} HTTP/1.1\r\nhost: gateway.test\r\ncontent-type: application/json\r\n` +
      `content-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`,
    { waitMs: 10_000 },
  )
  // The proxy closes after its answer: a client left waiting is the hang this test looks for.
  expect(closed).toBe(true)
  return text
}

/** expectRefused: `raw` is a complete 502 bad_gateway in the proxy shape holding nothing of the engine's reply. */
function expectRefused(raw: string): void {
  const end = raw.indexOf('\r\n\r\n')
  expect(end).toBeGreaterThan(0)
  const head = raw.slice(0, end).toLowerCase()
  expect(head.startsWith('http/1.1 502 ')).toBe(true)
  expect(head).not.toContain('x-injected')
  expect(head).not.toMatch(/(^|\n)x-a/)
  expect(raw).not.toContain(BODY)
  const length = Number(/\r\ncontent-length: (\d+)/.exec(head)?.[1])
  const body = raw.slice(end + 4)
  expect(body.length).toBe(length)
  const error = (JSON.parse(body) as { error: Record<string, unknown> }).error
  expect(error).toEqual({
    message: expect.stringMatching(/^The model engine sent a malformed response \(/),
    type: 'bad_gateway',
    code: 'bad_gateway',
  })
}

describe('a malformed engine reply through the gateway (wire front)', () => {
  const api = new FakeGateway()
  let engine: RawHttpServer
  let px: ProxyHost
  /** The engine's connection of the last request, for a test that sends the rest of a reply later. */
  let engineSocket: { write(b: string): unknown } | null = null

  beforeAll(async () => {
    engine = rawHttpServer((s) => {
      engineSocket = s
      s.write(reply.bytes)
    })
    api.add(instance('bad', engine.port))
    // A first-byte deadline longer than the test's own timeout: a hang fails the test, not a 504.
    px = await startProxyHost(api, { firstByteTimeoutMs: 60_000 })
  })
  afterAll(async () => {
    await px.stop()
    engine.stop()
  })

  const port = () => Number(px.url.slice(px.url.lastIndexOf(':') + 1))

  it.each(BAD)('refuses %s with 502 bad_gateway and closes the engine connection', async (_name, bytes) => {
    reply.bytes = bytes
    const opened = engine.opened
    const closed = engine.closed
    const events = px.events.length
    const logs = px.logs.length
    expectRefused(await sendRaw(port(), '/v1/chat/completions'))
    // The engine connection is dropped, not pooled for the next request.
    await waitFor('the engine connection to close', () => engine.closed === closed + 1, { timeoutMs: 2000 })
    expect(engine.opened).toBe(opened + 1)
    await waitFor('the proxy.request event', () => px.events.length === events + 1, { timeoutMs: 2000 })
    expect(px.events.at(-1)).toMatchObject({ status: 502, instance_id: 'bad' })
    const warned = px.logs.slice(logs).filter((l) => l.includes('upstream failure'))
    expect(warned).toHaveLength(1)
    expect(warned[0]).toContain('bad_gateway')
    await waitFor('lease released', () => api.totalInFlight() === 0, { timeoutMs: 2000 })
  })

  // A stream already relayed with the engine's own chunk framing: what the engine sends after its
  // last chunk, or in a malformed trailer, must not reach the client (a client reusing or
  // pipelining on the connection would read it as the next response).
  it.each([
    [
      'a whole response after the last chunk',
      '0\r\n\r\nHTTP/1.1 200 OK\r\nX-Injected: yes\r\ncontent-length: 5\r\n\r\nEVIL!',
    ],
    ['a trailer with a bare LF', '0\r\nx-t: a\nX-Injected: yes\r\n\r\n'],
    ['a malformed chunk after good ones', '3\r\nabc\r\nzz\r\nX-Injected: yes\r\n\r\n'],
  ])('sends nothing of %s once a stream is running', async (_name, rest) => {
    reply.bytes = `HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n6\r\nENGINE\r\n`
    const client = await Raw.open(port())
    const body = '{"model":"bad","messages":[]}'
    client.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`,
    )
    // The first chunk reached the client: the stream is running, the rest comes in another read.
    expect(await client.waitFor((c) => c.text.includes('ENGINE'), 5000)).toBe(true)
    engineSocket!.write(rest)
    await client.waitFor((c) => c.closed || c.text.includes('\r\n0\r\n\r\n'), 5000)
    // A stray byte would arrive before the answer to a next request on the connection (TCP keeps
    // the order), unless the proxy closed it: wait for that answer or the close.
    if (!client.closed) client.write('GET /api/nope HTTP/1.1\r\nhost: a\r\n\r\n')
    await client.waitFor((c) => c.closed || c.text.includes('HTTP/1.1 404 '), 5000)
    expect(client.text).not.toContain('X-Injected')
    expect(client.text).not.toContain('EVIL')
    client.socket.terminate()
  })

  it.each([
    ['a Content-Length reply', `${JSON_HEAD}x-a: 1\r\ncontent-length: 11\r\n\r\n${BODY}`],
    [
      'a chunked reply',
      `${JSON_HEAD}x-a: 1\r\ntransfer-encoding: Chunked \r\n\r\n6\r\nENGINE\r\n5\r\n-BODY\r\n0\r\n\r\n`,
    ],
  ])('still relays %s unchanged, on a pooled connection', async (_name, bytes) => {
    reply.bytes = bytes
    const first = await fetch(`${px.url}/v1/chat/completions`, {
      method: 'POST',
      body: '{"model":"bad","messages":[]}',
    })
    expect(first.status).toBe(200)
    expect(first.headers.get('x-a')).toBe('1')
    expect(await first.text()).toBe(BODY)
    const opened = engine.opened
    const again = await fetch(`${px.url}/v1/chat/completions`, {
      method: 'POST',
      body: '{"model":"bad","messages":[]}',
    })
    expect(await again.text()).toBe(BODY)
    expect(engine.opened).toBe(opened)
  })
})
