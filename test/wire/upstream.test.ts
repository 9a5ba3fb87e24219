import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { abortable } from '../../src/host/abortable.ts'
import {
  ProtocolError,
  type ResponseHead,
  ResponseParser,
  wholeReply,
} from '../../src/wire/response-parser.ts'
import { parse as parseRaw, rawExchange } from '../support/raw-client.ts'
import { rawHttpServer } from '../support/raw-http.ts'
import { waitFor } from '../support/wait.ts'
import { FakeGateway, instance, type ProxyHost, startProxyHost, startStub } from './support.ts'

interface Parsed {
  heads: ResponseHead[]
  body: string
  ended: number
}

function parse(
  raw: string,
  opts: { headOnly?: boolean; split?: number } = {},
): Parsed & { parser: ResponseParser } {
  const out: Parsed = { heads: [], body: '', ended: 0 }
  const parser = new ResponseParser(
    {
      head: (h) => out.heads.push(h),
      body: (buf, start, end) => {
        out.body += buf.toString('latin1', start, end)
      },
      end: () => {
        out.ended++
      },
    },
    opts.headOnly ?? false,
  )
  const bytes = Buffer.from(raw, 'latin1')
  const step = opts.split ?? bytes.length
  for (let i = 0; i < bytes.length; i += step) parser.feed(Buffer.from(bytes.subarray(i, i + step)))
  return Object.assign(out, { parser })
}

describe('HTTP/1.1 response parser', () => {
  const chunked =
    'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n' +
    '7\r\ndata: 1\r\n9;ext=1\r\n\ndata: 2\n\r\n0\r\nx-trailer: t\r\n\r\n'

  it.each([1, 2, 3, 7, 1000])('decodes a chunked body fed %i bytes at a time', (split) => {
    const r = parse(chunked, { split })
    expect(r.heads).toHaveLength(1)
    expect(r.heads[0]).toMatchObject({ status: 200, framing: 'chunked', keepAlive: true, length: -1 })
    expect(r.heads[0]!.headers).toContainEqual(['content-type', 'text/event-stream'])
    expect(r.body).toBe('data: 1\ndata: 2\n')
    expect(r.ended).toBe(1)
  })

  it('reads a Content-Length body split anywhere', () => {
    const r = parse('HTTP/1.1 201 Created\r\ncontent-length: 5\r\n\r\nhello', { split: 4 })
    expect(r.heads[0]).toMatchObject({ status: 201, framing: 'length', length: 5 })
    expect(r.body).toBe('hello')
    expect(r.ended).toBe(1)
  })

  it('skips interim 1xx responses', () => {
    const r = parse('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok')
    expect(r.heads.map((h) => h.status)).toEqual([200])
    expect(r.body).toBe('ok')
  })

  it.each([
    ['204', 'HTTP/1.1 204 No Content\r\ncontent-length: 10\r\n\r\n', false],
    ['304', 'HTTP/1.1 304 Not Modified\r\n\r\n', false],
    ['HEAD', 'HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n', true],
  ])('knows a %s response has no body', (_name, raw, headOnly) => {
    const r = parse(raw, { headOnly })
    expect(r.heads[0]!.framing).toBe('none')
    expect(r.ended).toBe(1)
  })

  it('reads an HTTP/1.0 body until the connection closes, and does not keep it alive', () => {
    const r = parse('HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nsome text')
    expect(r.heads[0]).toMatchObject({ framing: 'close', keepAlive: false })
    expect(r.ended).toBe(0)
    expect(r.parser.closed()).toBe(true)
    expect(r.body).toBe('some text')
    expect(r.ended).toBe(1)
  })

  it('honours Connection: close', () => {
    expect(
      parse('HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 0\r\n\r\n').heads[0]!.keepAlive,
    ).toBe(false)
  })

  it('notices bytes after the end of a response', () => {
    expect(parse('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA').parser.trailingBytes).toBe(true)
  })

  it.each([
    ['a bad status line', 'HTXP/1.1 200 OK\r\n\r\n'],
    ['a bad chunk size', 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n'],
    ['conflicting lengths', 'HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n'],
    ['chunk data without CRLF', 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nab'],
  ])('rejects %s', (_name, raw) => {
    expect(() => parse(raw)).toThrow()
  })

  // Issue 16: an engine must not be able to inject headers into the client's response, nor leave
  // it waiting on framing the parser only half understands. Every case is refused whole.
  const ok = 'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n'
  it.each([
    ['a bare LF in a value', `${ok}x-a: a\nX-Injected: yes\r\ncontent-length: 2\r\n\r\n{}`],
    ['a bare CR in a value', `${ok}x-a: a\rX-Injected: yes\r\ncontent-length: 2\r\n\r\n{}`],
    ['a NUL in a value', `${ok}x-a: a\0b\r\ncontent-length: 2\r\n\r\n{}`],
    ['a DEL in a value', `${ok}x-a: a\x7fb\r\ncontent-length: 2\r\n\r\n{}`],
    ['a control byte in a value', `${ok}x-a: a\x1bb\r\ncontent-length: 2\r\n\r\n{}`],
    ['a bare LF in the last value', `${ok}content-length: 2\r\nx-a: a\nX-Injected: yes\r\n\r\n{}`],
    ['whitespace before the colon', `${ok}x-a : a\r\ncontent-length: 2\r\n\r\n{}`],
    ['a name that is not a token', `${ok}x(a): a\r\ncontent-length: 2\r\n\r\n{}`],
    ['an empty name', `${ok}: a\r\ncontent-length: 2\r\n\r\n{}`],
    ['a line without a colon', `${ok}x-a\r\ncontent-length: 2\r\n\r\n{}`],
    ['an obs-fold continuation line', `${ok}x-a: a\r\n X-Injected: yes\r\ncontent-length: 2\r\n\r\n{}`],
    ['a tab-folded continuation line', `${ok}x-a: a\r\n\tb\r\ncontent-length: 2\r\n\r\n{}`],
    ['Transfer-Encoding: xchunked', `${ok}transfer-encoding: xchunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n`],
    ['Transfer-Encoding: gzip, chunked', `${ok}transfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n`],
    ['Transfer-Encoding: chunked, chunked', `${ok}transfer-encoding: chunked, chunked\r\n\r\n0\r\n\r\n`],
    ['Transfer-Encoding: identity', `${ok}transfer-encoding: identity\r\ncontent-length: 2\r\n\r\n{}`],
    [
      'two Transfer-Encoding lines',
      `${ok}transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n`,
    ],
    [
      'Transfer-Encoding with Content-Length',
      `${ok}content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n`,
    ],
    [
      'Content-Length after Transfer-Encoding',
      `${ok}transfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n`,
    ],
    ['Transfer-Encoding in HTTP/1.0', 'HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n'],
    ['a hex Content-Length', `${ok}content-length: 0x2\r\n\r\n{}`],
    ['an empty Content-Length', `${ok}content-length:\r\n\r\n`],
    ['a Content-Length list', `${ok}content-length: 2, 2\r\n\r\n{}`],
    ['a status that is not three digits', 'HTTP/1.1 2e2 OK\r\ncontent-length: 0\r\n\r\n'],
    ['a control byte in the reason phrase', 'HTTP/1.1 200 O\0K\r\ncontent-length: 0\r\n\r\n'],
    [
      'a bare LF in an interim response',
      'HTTP/1.1 103 Early Hints\r\nlink: a\nx: b\r\n\r\nHTTP/1.1 200 OK\r\n\r\n',
    ],
  ])('refuses %s, fed whole or a byte at a time', (_name, raw) => {
    for (const split of [raw.length, 1]) {
      const seen: string[] = []
      const parser = new ResponseParser(
        { head: () => seen.push('head'), body: () => seen.push('body'), end: () => seen.push('end') },
        false,
      )
      const bytes = Buffer.from(raw, 'latin1')
      expect(() => {
        for (let i = 0; i < bytes.length; i += split) parser.feed(bytes.subarray(i, i + split))
      }).toThrow(ProtocolError)
      // Nothing of the response was reported: a caller has nothing to relay.
      expect(seen).toEqual([])
    }
  })

  it('refuses a malformed trailer field', () => {
    const raw = `${ok}transfer-encoding: chunked\r\n\r\n1\r\na\r\n0\r\nx-t: a\nX-Injected: yes\r\n\r\n`
    expect(() => parse(raw)).toThrow('malformed trailer field')
    expect(() => parse(raw, { split: 1 })).toThrow('malformed trailer field')
  })

  it.each([1, 5, 1000])(
    'refuses a head whose lines end in bare LF at once, fed %i bytes at a time',
    (split) => {
      // No CRLFCRLF ever comes: without this the reply would wait for a deadline that may not exist.
      expect(() => parse('HTTP/1.1 200 OK\ncontent-length: 2\n\n{}', { split })).toThrow(
        'bare LF in response head',
      )
    },
  )

  it('keeps HTAB and obs-text in values, trims only SP and HTAB around them', () => {
    const r = parse(`${ok}x-a: \t a\tb\xe9\xa0 \t\r\nx-b:\r\nTransfer-Encoding: \tChunKed \r\n\r\n0\r\n\r\n`)
    expect(r.heads[0]!.headers).toEqual([
      ['content-type', 'application/json'],
      ['x-a', 'a\tb\xe9\xa0'],
      ['x-b', ''],
      ['transfer-encoding', 'ChunKed'],
    ])
    expect(r.heads[0]!.framing).toBe('chunked')
    expect(r.ended).toBe(1)
  })

  it('reads a status line without a reason phrase, and well-formed trailers', () => {
    const r = parse('HTTP/1.1 200\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n0\r\nx-t: 1\r\n\r\n')
    expect(r.heads[0]!.status).toBe(200)
    expect(r.body).toBe('a')
    expect(r.ended).toBe(1)
  })

  it.each([1000, 1 << 20])('rejects a chunk size line over 8 KiB, read %i bytes at a time', (split) => {
    const long = `HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;${'x'.repeat(9000)}\r\na\r\n0\r\n\r\n`
    expect(() => parse(long, { split })).toThrow('chunk size line too long')
    // Just under the limit, the same extension is read.
    const ok = `HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;${'x'.repeat(8000)}\r\na\r\n0\r\n\r\n`
    expect(parse(ok, { split }).body).toBe('a')
  })
})

describe('wholeReply (the verbatim relay of a complete reply)', () => {
  const reply = (head: string) =>
    Buffer.from(`HTTP/1.1 200 OK\r\n${head}content-length: 2\r\n\r\n{}`, 'latin1')

  it('takes a plain complete reply', () => {
    expect(wholeReply(reply('content-type: application/json\r\nx-a: a\tb\xe9\r\n'))).toEqual({
      status: 200,
      bodyBytes: 2,
    })
  })

  // Relayed byte for byte, the head must be as clean as the full parser wants it: anything else
  // goes to the full parser (null), which refuses it.
  it.each([
    ['a bare LF in a value', 'x-a: a\nX-Injected: yes\r\n'],
    ['a bare CR in a value', 'x-a: a\rX-Injected: yes\r\n'],
    ['a NUL in a value', 'x-a: a\0b\r\n'],
    ['a DEL in a value', 'x-a: a\x7fb\r\n'],
    ['an escape in a value', 'x-a: \x1b[31m\r\n'],
    ['whitespace before the colon', 'x-a : a\r\n'],
    ['a name that is not a token', 'x/a: a\r\n'],
    ['an empty name', ': a\r\n'],
    ['an obs-fold line', 'x-a: a\r\n folded\r\n'],
  ])('leaves %s to the full parser', (_name, head) => {
    expect(wholeReply(reply(head))).toBeNull()
  })

  it('leaves a control byte in the reason phrase, or a four-digit status, to the full parser', () => {
    expect(wholeReply(Buffer.from('HTTP/1.1 200 O\0K\r\ncontent-length: 2\r\n\r\n{}', 'latin1'))).toBeNull()
    expect(wholeReply(Buffer.from('HTTP/1.1 2000 OK\r\ncontent-length: 2\r\n\r\n{}', 'latin1'))).toBeNull()
  })
})

describe('upstream connections of the proxy', () => {
  let closeAfterReply = false
  const server = rawHttpServer((s, _head, body) => {
    const reply = JSON.stringify({ len: body.length })
    s.write(
      `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${reply.length}\r\n\r\n${reply}`,
    )
    // A server that silently drops idle keep-alive connections right after replying.
    if (closeAfterReply) s.end()
  })
  const api = new FakeGateway()
  let px: ProxyHost

  beforeAll(async () => {
    api.add(instance('m', server.port))
    px = await startProxyHost(api)
  })
  afterAll(async () => {
    await px.stop()
    server.stop()
  })

  const send = async (body: string) => {
    const res = await fetch(`${px.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    })
    expect(res.status).toBe(200)
    return (await res.json()) as { len: number }
  }

  it('reuses a keep-alive connection', async () => {
    const before = server.opened
    // The engine's served name, so the proxy forwards the body unchanged.
    const body = '{"model":"m-served"}'
    for (let i = 0; i < 5; i++) expect(await send(body)).toEqual({ len: body.length })
    expect(server.opened - before).toBe(1)
  })

  it('goes on with a new connection when the engine closed a pooled one', async () => {
    closeAfterReply = true
    try {
      const closed = server.closed
      expect(await send('{"model":"m-served"}')).toEqual({ len: 20 })
      await waitFor('the engine to close its side', () => server.closed === closed + 1, { timeoutMs: 2000 })
      expect(await send('{"model":"m-served","a":1}')).toEqual({ len: 26 })
    } finally {
      closeAfterReply = false
    }
  })

  it('writes a large body completely', async () => {
    const big = `{"model":"m-served","x":"${'x'.repeat(8 * 1024 * 1024)}"}`
    expect(await send(big)).toEqual({ len: big.length })
  })
})

describe('proxy concurrency', () => {
  const api = new FakeGateway()
  let px: ProxyHost
  let open = 0
  let maxOpen = 0
  /** Every stream holds its first event until `expected` are open at once (or 5 s have passed). */
  let expected = Number.POSITIVE_INFINITY
  const allOpen = Promise.withResolvers<void>()
  const stub = startStub(() => {
    open++
    maxOpen = Math.max(maxOpen, open)
    if (open >= expected) allOpen.resolve()
    let n = 0
    return new Response(
      new ReadableStream({
        async pull(c) {
          if (n === 0)
            await abortable(allOpen.promise, { timeoutMs: 5000, what: `${expected} open streams` }).catch(
              () => {},
            )
          if (n++ < 1) c.enqueue(new TextEncoder().encode('data: x\n\n'))
          else {
            open--
            c.close()
          }
        },
      }),
      { headers: { 'content-type': 'text/event-stream' } },
    )
  })

  beforeAll(async () => {
    api.add(instance('m', stub.port))
    px = await startProxyHost(api)
  })
  afterAll(async () => {
    await px.stop()
    stub.stop()
  })

  // fetch() would queue everything past 256 requests in flight (BUN_CONFIG_MAX_HTTP_REQUESTS), on
  // the client side as in a proxy built on it: the clients here are raw sockets.
  it('keeps more than 256 upstream streams open at once', async () => {
    const n = 400
    expected = n
    const port = Number(px.url.slice(px.url.lastIndexOf(':') + 1))
    const body = '{"model":"m","stream":true}'
    const request = `POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`
    const results = await Promise.all(
      Array.from({ length: n }, async () => {
        const r = await rawExchange(port, request, { waitMs: 20_000 })
        return parseRaw(r.text)[0]?.body
      }),
    )
    expect(results.every((t) => t === 'data: x\n\n')).toBe(true)
    expect(maxOpen).toBe(n)
    await waitFor('leases released', () => api.totalInFlight() === 0, { timeoutMs: 3000 })
  }, 30_000)
})
