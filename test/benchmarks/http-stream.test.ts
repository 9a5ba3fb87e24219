import { afterAll, beforeEach, describe, expect, it } from 'bun:test'
import { encodeRequest, HttpStreamClient } from '../../plugins/benchmarks/http-stream.ts'
import { rawHttpServer } from '../support/raw-http.ts'

/**
 * The benchmark runner's HTTP/1.1 client against a raw server that answers every request with a
 * scripted list of writes (each flushed on its own, `gapMs` apart), so replies can be split at any
 * byte and framed any way an engine or a proxy might.
 */
interface Script {
  writes: string[]
  gapMs?: number
  /** close: the server closes the connection after the last write. */
  close?: boolean
}

let script: Script = { writes: [] }
const server = rawHttpServer(async (s) => {
  const { writes, gapMs = 0, close = false } = script
  for (const w of writes) {
    s.write(w)
    if (gapMs) await Bun.sleep(gapMs)
  }
  if (close) s.end()
})
const url = new URL(`http://127.0.0.1:${server.port}/v1/completions`)
let client = new HttpStreamClient()

afterAll(() => {
  client.close()
  server.stop()
})

interface Outcome {
  status: number
  error: string | null
  body: string
}

function request(): Promise<Outcome> {
  return new Promise((resolve) => {
    let body = ''
    const deadline = setTimeout(() => resolve({ status: -1, error: 'test deadline', body }), 5000)
    client.request(url, encodeRequest(url, {}, '{"prompt":"hi"}'), {
      body(text) {
        body += text
      },
      end(status, error) {
        clearTimeout(deadline)
        resolve({ status, error, body })
      },
    })
  })
}

const CHUNKED = 'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n'

describe('benchmark HTTP client', () => {
  beforeEach(() => {
    client.close()
    client = new HttpStreamClient()
    server.opened = 0
  })

  it('reads a chunked stream split anywhere, and reuses the connection after it', async () => {
    script = {
      writes: [`${CHUNKED}7\r\nda`, 'ta: 1\r\n', '9;ext=1\r\n\ndata: 2\n\r', '\n0\r\n', '\r\n'],
      gapMs: 5,
    }
    expect(await request()).toEqual({ status: 200, error: null, body: 'data: 1\ndata: 2\n' })
    expect(await request()).toEqual({ status: 200, error: null, body: 'data: 1\ndata: 2\n' })
    expect(server.opened).toBe(1)
  })

  it('reads a Content-Length body and skips an interim 100 Continue', async () => {
    script = {
      writes: ['HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhe', 'llo'],
    }
    expect(await request()).toEqual({ status: 200, error: null, body: 'hello' })
    expect(await request()).toEqual({ status: 200, error: null, body: 'hello' })
    expect(server.opened).toBe(1)
  })

  it('reads a body delimited by the close, and does not reuse that connection', async () => {
    script = {
      writes: ['HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nsome ', 'text'],
      close: true,
      gapMs: 5,
    }
    expect(await request()).toEqual({ status: 200, error: null, body: 'some text' })
    expect(await request()).toEqual({ status: 200, error: null, body: 'some text' })
    expect(server.opened).toBe(2)
  })

  it("ends a non-2xx reply with the engine's error message and no body", async () => {
    const error = JSON.stringify({
      object: 'error',
      message: 'max_tokens is too large',
      type: 'BadRequestError',
    })
    script = { writes: [`HTTP/1.1 400 Bad Request\r\ncontent-length: ${error.length}\r\n\r\n${error}`] }
    expect(await request()).toEqual({ status: 400, error: 'max_tokens is too large', body: '' })
  })

  it('fails a malformed chunked body and does not reuse its connection', async () => {
    script = { writes: [`${CHUNKED}zz\r\ndata: 1\r\n0\r\n\r\n`] }
    const r = await request()
    expect(r.status).toBe(200)
    expect(r.error).toContain('chunk')
    script = { writes: [`${CHUNKED}0\r\n\r\n`] }
    expect(await request()).toEqual({ status: 200, error: null, body: '' })
    expect(server.opened).toBe(2)
  })

  it('fails a stream the server closes mid-response', async () => {
    script = { writes: [`${CHUNKED}7\r\ndata: 1\r\n`], close: true }
    expect(await request()).toEqual({ status: 200, error: 'connection closed mid-response', body: 'data: 1' })
  })
})

describe('benchmark HTTP client: connections', () => {
  it('sends the request again on a fresh connection when the server had closed the pooled one', async () => {
    // The server answers the first request on each connection and drops the connection on the
    // second without a byte: what a uvicorn keep-alive timeout racing the next request looks like.
    const served = new WeakMap<object, number>()
    const flaky = rawHttpServer((s) => {
      const n = (served.get(s) ?? 0) + 1
      served.set(s, n)
      if (n > 1) s.end()
      else s.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok')
    })
    const c = new HttpStreamClient()
    const u = new URL(`http://127.0.0.1:${flaky.port}/v1/completions`)
    const once = () =>
      new Promise<[number, string | null]>((resolve) =>
        c.request(u, encodeRequest(u, {}, '{}'), {
          body() {},
          end: (status, error) => resolve([status, error]),
        }),
      )
    try {
      expect(await once()).toEqual([200, null])
      expect(await once()).toEqual([200, null])
      expect(flaky.opened).toBe(2)
    } finally {
      c.close()
      flaky.stop()
    }
  })

  it('close ends a running stream with "client closed" and closes its connection', async () => {
    const held = rawHttpServer((s) => {
      s.write(`${CHUNKED}7\r\ndata: 1\r\n`)
    })
    const c = new HttpStreamClient()
    const u = new URL(`http://127.0.0.1:${held.port}/v1/completions`)
    try {
      let first!: () => void
      const bodySeen = new Promise<void>((r) => {
        first = r
      })
      const ended = new Promise<[number, string | null]>((resolve) =>
        c.request(u, encodeRequest(u, {}, '{}'), { body: () => first(), end: (s, e) => resolve([s, e]) }),
      )
      await bodySeen
      const closed = held.nextClose()
      c.close()
      expect(await ended).toEqual([0, 'client closed'])
      await closed
      expect(held.closed).toBe(1)
      // A closed client refuses new requests at once.
      const late = await new Promise<string | null>((resolve) =>
        c.request(u, encodeRequest(u, {}, '{}'), { body() {}, end: (_s, e) => resolve(e) }),
      )
      expect(late).toBe('client closed')
    } finally {
      held.stop()
    }
  })

  it('speaks TLS to an https origin whose certificate it trusts, and refuses one it does not', async () => {
    const dir = `${import.meta.dir}/../fixtures/tls`
    const cert = await Bun.file(`${dir}/cert.pem`).text()
    const tls = Bun.serve({
      hostname: '127.0.0.1',
      port: 0,
      tls: { cert, key: await Bun.file(`${dir}/key.pem`).text() },
      fetch: () =>
        new Response('data: {"choices":[{"text":"x"}]}\n\n', {
          headers: { 'content-type': 'text/event-stream' },
        }),
    })
    const u = new URL(`https://127.0.0.1:${tls.port}/v1/completions`)
    const run = (c: HttpStreamClient) =>
      new Promise<Outcome>((resolve) => {
        let body = ''
        c.request(u, encodeRequest(u, {}, '{}'), {
          body: (t) => {
            body += t
          },
          end: (status, error) => resolve({ status, error, body }),
        })
      })
    const trusting = new HttpStreamClient({ ca: cert })
    const wary = new HttpStreamClient()
    try {
      expect(await run(trusting)).toEqual({
        status: 200,
        error: null,
        body: 'data: {"choices":[{"text":"x"}]}\n\n',
      })
      const refused = await run(wary)
      expect(refused.status).toBe(0)
      expect(refused.error).toMatch(/cert/i)
    } finally {
      trusting.close()
      wary.close()
      tls.stop(true)
    }
  })
})
