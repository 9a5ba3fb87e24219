import { describe, expect, test } from 'bun:test'
import type { BodyRange } from '../../src/wire/body-range.ts'
import {
  DEFAULT_LIMITS,
  header,
  headerPairs,
  type ParsedRequest,
  type ParserLimits,
  RequestError,
  RequestParser,
} from '../../src/wire/request-parser.ts'

const bytes = (s: string): Buffer => Buffer.from(s, 'latin1')
const text = (b: BodyRange): string => Buffer.from(b.bytes()).toString('latin1')

/** feed pushes raw in pieces of `split` bytes (each its own Buffer), collecting every request. */
function feed(raw: string, split = raw.length, limits?: Partial<ParserLimits>): ParsedRequest[] {
  const p = new RequestParser(limits)
  const out: ParsedRequest[] = []
  const all = bytes(raw)
  for (let i = 0; i < all.length; i += split) {
    p.push(Buffer.from(all.subarray(i, i + split)))
    for (let r = p.next(); r; r = p.next()) out.push(r)
  }
  expect(p.buffered).toBe(0)
  expect(p.pendingHead).toBeNull()
  return out
}

/** refusal returns the status the parser refuses raw with (fed whole or `split` bytes at a time), 0 if none. */
function refusal(raw: string, split = raw.length, limits?: Partial<ParserLimits>): number {
  const p = new RequestParser(limits)
  const all = bytes(raw)
  try {
    for (let i = 0; i < all.length; i += split) {
      p.push(Buffer.from(all.subarray(i, i + split)))
      while (p.next());
    }
  } catch (err) {
    expect(err).toBeInstanceOf(RequestError)
    return (err as RequestError).status
  }
  return 0
}

const GET = 'GET /v1/models?x=1&y=2 HTTP/1.1\r\nHost: gw.local\r\nUser-Agent: t\r\nAccept: */*\r\n\r\n'
const JSON_BODY = '{"model":"m","messages":[{"role":"user","content":"hello"}],"n":1}'
const POST =
  'POST /v1/chat/completions HTTP/1.1\r\nHost: gw.local\r\nContent-Type: application/json\r\n' +
  `Authorization: Bearer sk-1\r\nContent-Length: ${JSON_BODY.length}\r\n\r\n${JSON_BODY}`
const CHUNKED =
  'POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n' +
  '5\r\nhello\r\n1;name=value;q="x y"\r\n,\r\n6 ;ext\r\n world\r\nA\r\n0123456789\r\n' +
  '0\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n'

describe('request parser: requests it accepts', () => {
  test('a simple GET', () => {
    const [r, ...rest] = feed(GET)
    expect(rest).toHaveLength(0)
    const { text: _t, fields: _f, raw: _r, rawStart: _s, ...head } = r!.head
    expect(head).toEqual({
      method: 'GET',
      target: '/v1/models?x=1&y=2',
      path: '/v1/models',
      query: '?x=1&y=2',
      http10: false,
      contentLength: -1,
      chunked: false,
      keepAlive: true,
      expectContinue: false,
      connection: '',
    })
    expect(headerPairs(r!.head)).toEqual([
      ['host', 'gw.local'],
      ['user-agent', 't'],
      ['accept', '*/*'],
    ])
    expect(r!.body.length).toBe(0)
  })

  test('a POST body is a range of the pushed buffer (no copy)', () => {
    const p = new RequestParser()
    const buf = bytes(POST)
    p.push(buf)
    const r = p.next()!
    expect(r.head.method).toBe('POST')
    expect(r.head.contentLength).toBe(JSON_BODY.length)
    expect(text(r.body)).toBe(JSON_BODY)
    expect(r.body.bytes().buffer).toBe(buf.buffer as ArrayBuffer)
    expect(r.body.bytes().byteOffset).toBe(buf.byteOffset + POST.length - JSON_BODY.length)
    expect(p.next()).toBeNull()
    expect(p.buffered).toBe(0)
  })

  test('names are lower-cased, values OWS-trimmed, latin1 kept, empty values allowed', () => {
    const [r] = feed(
      'GET / HTTP/1.1\r\nHOST:a\r\nX-Mixed-Case: \t v\tw \t\r\nX-Latin: caf\xe9\xa0\r\nX-Empty:\r\n\r\n',
    )
    expect(headerPairs(r!.head)).toEqual([
      ['host', 'a'],
      ['x-mixed-case', 'v\tw'],
      ['x-latin', 'caf\xe9\xa0'],
      ['x-empty', ''],
    ])
  })

  test('the names the parser acts on are recognised in any case, and only those names', () => {
    const [r] = feed(
      'POST /x HTTP/1.1\r\nhOsT: A.Example\r\nCONNECTION: X-Secret, Keep-Alive\r\nEXPECT: 100-Continue\r\n' +
        'x^y: caret\r\nTRANSFER-ENCODING: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
    )
    const h = r!.head
    expect([h.chunked, h.expectContinue, h.connection, h.keepAlive]).toEqual([
      true,
      true,
      'x-secret, keep-alive',
      true,
    ])
    expect(text(r!.body)).toBe('ok')
    expect(header(h, 'host')).toBe('A.Example')
    expect(header(h, 'connection')).toBe('X-Secret, Keep-Alive')
    // Only letters are folded: '^' and '~' differ by the case bit but are different names.
    expect(header(h, 'x~y')).toBeNull()
    expect(header(h, 'x^y')).toBe('caret')
    expect(feed('GET / HTTP/1.1\r\nHost: a\r\nCoNnEcTiOn: CLOSE\r\n\r\n')[0]!.head.keepAlive).toBe(false)
    expect(() => feed('GET / HTTP/1.1\r\nHOST: a\r\nhost: b\r\n\r\n')).toThrow('missing or repeated Host')
  })

  test.each([1, 2, 3, 7, 64])('a POST fed %i bytes at a time', (split) => {
    const [r, ...rest] = feed(POST, split)
    expect(rest).toHaveLength(0)
    expect(r!.head.path).toBe('/v1/chat/completions')
    expect(header(r!.head, 'authorization')).toBe('Bearer sk-1')
    expect(text(r!.body)).toBe(JSON_BODY)
  })

  test('pendingHead is set while the body arrives, and null once the request is returned', () => {
    const p = new RequestParser()
    const headEnd = POST.length - JSON_BODY.length
    p.push(bytes(POST.slice(0, headEnd + 10)))
    expect(p.next()).toBeNull()
    expect(p.pendingHead?.path).toBe('/v1/chat/completions')
    expect(p.buffered).toBe(10)
    p.push(bytes(POST.slice(headEnd + 10)))
    expect(text(p.next()!.body)).toBe(JSON_BODY)
    expect(p.pendingHead).toBeNull()
  })

  test('two and three pipelined requests in one push come out in order', () => {
    const two = feed(POST + GET)
    expect(two.map((r) => r.head.method)).toEqual(['POST', 'GET'])
    expect(text(two[0]!.body)).toBe(JSON_BODY)
    const three = feed(GET + POST + CHUNKED)
    expect(three.map((r) => r.head.path)).toEqual(['/v1/models', '/v1/chat/completions', '/up'])
    expect(three.map((r) => text(r.body))).toEqual(['', JSON_BODY, 'hello, world0123456789'])
  })

  test('a pipelined second request split across pushes stays buffered until complete', () => {
    const p = new RequestParser()
    const cut = GET.length + 40
    p.push(bytes(GET + POST.slice(0, 40)))
    expect(p.next()!.head.method).toBe('GET')
    expect(p.next()).toBeNull()
    expect(p.buffered).toBe(40)
    expect(p.pendingHead).toBeNull()
    p.push(bytes((GET + POST).slice(cut, cut + 100)))
    expect(p.next()).toBeNull()
    p.push(bytes((GET + POST).slice(cut + 100)))
    const r = p.next()!
    expect(r.head.method).toBe('POST')
    expect(text(r.body)).toBe(JSON_BODY)
    expect(p.next()).toBeNull()
    expect(p.buffered).toBe(0)
  })

  test.each([1, 2, 5, 1000])('a chunked body (extensions, trailers) fed %i bytes at a time', (split) => {
    const [r, ...rest] = feed(CHUNKED, split)
    expect(rest).toHaveLength(0)
    expect(r!.head.chunked).toBe(true)
    expect(r!.head.contentLength).toBe(-1)
    expect(text(r!.body)).toBe('hello, world0123456789')
  })

  test('a chunked body in one chunk is not copied; an empty chunked body is empty', () => {
    const raw = 'POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked \r\n\r\n3\r\nabc\r\n0\r\n\r\n'
    const p = new RequestParser()
    const buf = bytes(raw)
    p.push(buf)
    const r = p.next()!
    expect(text(r.body)).toBe('abc')
    expect(r.body.bytes().buffer).toBe(buf.buffer as ArrayBuffer)
    const [e] = feed('POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n')
    expect(e!.body.length).toBe(0)
  })

  test('a GET with Content-Length has that body (framing does not depend on the method)', () => {
    const [r, next] = feed(`GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc${GET}`)
    expect(text(r!.body)).toBe('abc')
    expect(next!.head.path).toBe('/v1/models')
  })

  test('identical repeated Content-Length headers count once', () => {
    const [r] = feed('POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok')
    expect(r!.head.contentLength).toBe(2)
    expect(text(r!.body)).toBe('ok')
  })

  test.each([
    ['HTTP/1.1', '', true, ''],
    ['HTTP/1.1', 'Connection: close\r\n', false, 'close'],
    ['HTTP/1.1', 'Connection: Keep-Alive, Upgrade\r\n', true, 'keep-alive, upgrade'],
    ['HTTP/1.1', 'Connection: upgrade\r\nConnection: CLOSE\r\n', false, 'upgrade, close'],
    ['HTTP/1.0', '', false, ''],
    ['HTTP/1.0', 'Connection: keep-alive\r\n', true, 'keep-alive'],
    ['HTTP/1.0', 'Connection: foo,  Keep-Alive\r\n', true, 'foo,  keep-alive'],
    ['HTTP/1.0', 'Connection: keep-alive-ish\r\n', false, 'keep-alive-ish'],
    ['HTTP/1.0', 'Connection: keep-alive, close\r\n', false, 'keep-alive, close'],
  ])('%s %p: keepAlive %p, connection %p', (version, extra, keepAlive, connection) => {
    const [r] = feed(`GET / ${version}\r\nHost: a\r\n${extra}\r\n`)
    expect(r!.head.http10).toBe(version === 'HTTP/1.0')
    expect(r!.head.keepAlive).toBe(keepAlive)
    expect(r!.head.connection).toBe(connection)
  })

  test('HTTP/1.0 may omit Host', () => {
    const [r] = feed('GET /x HTTP/1.0\r\n\r\n')
    expect(r!.head.http10).toBe(true)
    expect(header(r!.head, 'host')).toBeNull()
  })

  test('Expect: 100-continue sets expectContinue and the head is pending before the body', () => {
    const p = new RequestParser()
    p.push(bytes('PUT /f HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 4\r\n\r\n'))
    expect(p.next()).toBeNull()
    expect(p.pendingHead?.expectContinue).toBe(true)
    expect(p.pendingHead?.method).toBe('PUT')
    p.push(bytes('da'))
    expect(p.next()).toBeNull()
    p.push(bytes('ta'))
    const r = p.next()!
    expect(r.head.expectContinue).toBe(true)
    expect(text(r.body)).toBe('data')
    expect(p.pendingHead).toBeNull()
  })

  test('HTTP/1.0 ignores Expect: 100-continue (RFC 9110 §10.1.1)', () => {
    const [r] = feed('POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx')
    expect(r!.head.expectContinue).toBe(false)
  })

  test('absolute-form targets are converted to origin-form', () => {
    const target = (t: string, host: string) => feed(`GET ${t} HTTP/1.1\r\nHost: ${host}\r\n\r\n`)[0]!.head
    expect(target('http://gw.local:8080/v1/x?y=1', 'gw.local:8080')).toMatchObject({
      target: '/v1/x?y=1',
      path: '/v1/x',
      query: '?y=1',
    })
    expect(target('HTTPS://GW.local', 'gw.LOCAL')).toMatchObject({ target: '/', path: '/', query: '' })
    expect(target('http://[::1]:80?q', '[::1]:80')).toMatchObject({ target: '/?q', path: '/', query: '?q' })
  })

  test("'*' is the target of OPTIONS", () => {
    const [r] = feed('OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n')
    expect(r!.head).toMatchObject({ method: 'OPTIONS', target: '*', path: '*', query: '' })
  })

  test('up to four empty lines before a request line are skipped, also split', () => {
    const raw = `\r\n\r\n${GET}\r\n${GET}`
    for (const split of [1, 3, raw.length])
      expect(feed(raw, split).map((r) => r.head.method)).toEqual(['GET', 'GET'])
    expect(refusal(`\r\n\r\n\r\n\r\n\r\n${GET}`)).toBe(400)
  })

  test('a method is case-sensitive: the implemented ones pass as sent, `get` is not GET (501)', () => {
    expect(feed('PATCH / HTTP/1.1\r\nHost: a\r\n\r\n')[0]!.head.method).toBe('PATCH')
    expect(() => feed('get / HTTP/1.1\r\nHost: a\r\n\r\n')).toThrow(
      new RequestError(501, 'method get is not implemented'),
    )
    expect(() => feed('M-SEARCH / HTTP/1.1\r\nHost: a\r\n\r\n')).toThrow(
      new RequestError(501, 'method M-SEARCH is not implemented'),
    )
  })

  test('header() returns the first value of a lower-case name, or null', () => {
    const [r] = feed('GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\n\r\n')
    expect(header(r!.head, 'x-a')).toBe('1')
    expect(header(r!.head, 'host')).toBe('a')
    expect(header(r!.head, 'X-A')).toBeNull()
    expect(header(r!.head, 'x-b')).toBeNull()
  })

  test('DEFAULT_LIMITS: 64 KiB head, 100 headers, 128 MiB body', () => {
    expect(DEFAULT_LIMITS).toEqual({ maxHeadBytes: 65536, maxHeaders: 100, maxBodyBytes: 134217728 })
    const many = Array.from({ length: 99 }, (_, i) => `X-${i}: v\r\n`).join('')
    expect(refusal(`GET / HTTP/1.1\r\nHost: a\r\n${many}\r\n`)).toBe(0)
    expect(refusal(`GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n${many}\r\n`)).toBe(431)
    expect(refusal(`POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 134217728\r\n\r\n`)).toBe(0)
    expect(refusal(`POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 134217729\r\n\r\n`)).toBe(413)
  })
})

const req = (line: string, fields = 'Host: a\r\n', body = '') => `${line}\r\n${fields}\r\n${body}`
const chunked = (body: string, path = '/') =>
  req(`POST ${path} HTTP/1.1`, 'Host: a\r\nTransfer-Encoding: chunked\r\n', body)

describe('request parser: refusals', () => {
  const cases: [string, string, number][] = [
    ['bare LF ending a field line', 'GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n', 400],
    ['bare LF ending the request line', 'GET / HTTP/1.1\nHost: a\r\n\r\n', 400],
    ['bare CR in a field line', 'GET / HTTP/1.1\r\nHost: a\rX: y\r\n\r\n', 400],
    ['obs-fold', req('GET / HTTP/1.1', 'Host: a\r\nX: y\r\n  z\r\n'), 400],
    ['obs-fold with HTAB', req('GET / HTTP/1.1', 'Host: a\r\nX: y\r\n\tz\r\n'), 400],
    ['space before the colon', req('GET / HTTP/1.1', 'Host : a\r\n'), 400],
    ['empty field name', req('GET / HTTP/1.1', 'Host: a\r\n: v\r\n'), 400],
    ['field line without colon', req('GET / HTTP/1.1', 'Host: a\r\nnocolon\r\n'), 400],
    ['bad method character', req('G(T / HTTP/1.1'), 400],
    ['request line with two spaces', req('GET  / HTTP/1.1'), 400],
    ['request line without version', req('GET /'), 400],
    ['HTTP/2.0', req('GET / HTTP/2.0'), 505],
    ['HTTP/1.2', req('GET / HTTP/1.2'), 505],
    ['http/1.1 in lower case', req('GET / http/1.1'), 400],
    ['HTTP/11', req('GET / HTTP/11'), 400],
    ['trailing space after the version', req('GET / HTTP/1.1 '), 400],
    ['missing Host on HTTP/1.1', req('GET / HTTP/1.1', 'X: y\r\n'), 400],
    ['two Hosts', req('GET / HTTP/1.1', 'Host: a\r\nHost: a\r\n'), 400],
    ['two Hosts on HTTP/1.0', req('GET / HTTP/1.0', 'Host: a\r\nHost: b\r\n'), 400],
    ['a Host with a space', req('GET / HTTP/1.1', 'Host: a b\r\n'), 400],
    ['a Host with userinfo', req('GET / HTTP/1.1', 'Host: u@a\r\n'), 400],
    ['a Host with a path', req('GET / HTTP/1.1', 'Host: a/b\r\n'), 400],
    ['a Host whose last byte is not allowed', req('GET / HTTP/1.1', 'Host: a.b\xe9\r\n'), 400],
    [
      'Content-Length and Transfer-Encoding',
      req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n', '0\r\n\r\n'),
      400,
    ],
    [
      'Transfer-Encoding on HTTP/1.0',
      req('POST / HTTP/1.0', 'Transfer-Encoding: chunked\r\n', '0\r\n\r\n'),
      400,
    ],
    ['Transfer-Encoding: gzip', req('POST / HTTP/1.1', 'Host: a\r\nTransfer-Encoding: gzip\r\n'), 501],
    [
      'Transfer-Encoding: gzip, chunked',
      req('POST / HTTP/1.1', 'Host: a\r\nTransfer-Encoding: gzip, chunked\r\n'),
      501,
    ],
    [
      'Transfer-Encoding: identity',
      req('POST / HTTP/1.1', 'Host: a\r\nTransfer-Encoding: identity\r\n'),
      501,
    ],
    [
      'Transfer-Encoding: chunked, chunked',
      req('POST / HTTP/1.1', 'Host: a\r\nTransfer-Encoding: chunked, chunked\r\n'),
      501,
    ],
    [
      'two Transfer-Encoding: chunked',
      req('POST / HTTP/1.1', 'Host: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n'),
      501,
    ],
    [
      'different Content-Lengths',
      req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n', 'ab'),
      400,
    ],
    [
      'Content-Lengths 5 and 05',
      req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 5\r\nContent-Length: 05\r\n', 'abcde'),
      400,
    ],
    ['Content-Length with +', req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: +1\r\n', 'a'), 400],
    ['Content-Length with -', req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: -1\r\n'), 400],
    ['Content-Length list', req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 1, 1\r\n', 'a'), 400],
    ['Content-Length with inner space', req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 1 1\r\n'), 400],
    ['Content-Length in hex', req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 0x1\r\n', 'a'), 400],
    ['empty Content-Length', req('POST / HTTP/1.1', 'Host: a\r\nContent-Length:\r\n'), 400],
    [
      'Content-Length beyond a safe integer',
      req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 99999999999999999999\r\n'),
      400,
    ],
    ['chunk size with no digits', chunked(';ext\r\nabc\r\n0\r\n\r\n'), 400],
    ['chunk size line empty', chunked('\r\n0\r\n\r\n'), 400],
    ['chunk size not hex', chunked('x\r\n0\r\n\r\n'), 400],
    ['chunk size with a sign', chunked('+3\r\nabc\r\n0\r\n\r\n'), 400],
    ['chunk size over 12 hex digits', chunked('0000000000003\r\nabc\r\n0\r\n\r\n'), 400],
    ['chunk size followed by space and no extension', chunked('3 \r\nabc\r\n0\r\n\r\n'), 400],
    ['chunk size line ending in bare LF', chunked('3\nabc\r\n0\r\n\r\n'), 400],
    ['chunk extension with bare LF', chunked('3;a\nabc\r\n0\r\n\r\n'), 400],
    ['chunk data not followed by CRLF', chunked('3\r\nabcX\r\n0\r\n\r\n'), 400],
    ['chunk data followed by LF only', chunked('3\r\nabc\n0\r\n\r\n'), 400],
    ['chunk data followed by X LF', chunked('3\r\nabcX\n0\r\n\r\n'), 400],
    ['chunk data followed by CR X', chunked('3\r\nabc\rX0\r\n\r\n'), 400],
    ['trailer with bare LF', chunked('0\r\nX: y\n\r\n'), 400],
    ['trailer with NUL', chunked('0\r\nX: \0\r\n\r\n'), 400],
    ['NUL in a value', req('GET / HTTP/1.1', 'Host: a\r\nX: a\0b\r\n'), 400],
    ['control byte in a value', req('GET / HTTP/1.1', 'Host: a\r\nX: a\x01b\r\n'), 400],
    ['DEL in a value', req('GET / HTTP/1.1', 'Host: a\r\nX: a\x7fb\r\n'), 400],
    ['control byte in the target', req('GET /a\x01b HTTP/1.1'), 400],
    ['DEL in the target', req('GET /a\x7f HTTP/1.1'), 400],
    ['HTAB in the target', req('GET /a\tb HTTP/1.1'), 400],
    ['byte >= 0x80 in the target', req('GET /caf\xe9 HTTP/1.1'), 400],
    ['fragment in the target', req('GET /a#b HTTP/1.1'), 400],
    ['backslash in the target', req('GET /api\\..\\v1 HTTP/1.1'), 400],
    ["'..' segment", req('GET /api/health/../v1/models HTTP/1.1'), 400],
    ["'.' segment", req('GET /./api HTTP/1.1'), 400],
    ["'..' at the end", req('GET /api/.. HTTP/1.1'), 400],
    ["'%2e%2e' segment", req('GET /api/health/%2e%2E/v1 HTTP/1.1'), 400],
    ["'.%2e' segment", req('GET /api/.%2e/v1 HTTP/1.1'), 400],
    ["'..' in an absolute-form target", req('GET http://a/x/../y HTTP/1.1'), 400],
    ['relative target', req('GET a/b HTTP/1.1'), 400],
    ["'*' with GET", req('GET * HTTP/1.1'), 400],
    ['authority-form target', req('OPTIONS a:443 HTTP/1.1'), 400],
    ['absolute-form with another scheme', req('GET ftp://a/ HTTP/1.1'), 400],
    ['absolute-form without host', req('GET http:///x HTTP/1.1'), 400],
    ['absolute-form with userinfo', req('GET http://u:p@a/ HTTP/1.1', 'Host: a\r\n'), 400],
    ['absolute-form disagreeing with Host', req('GET http://b/ HTTP/1.1', 'Host: a\r\n'), 400],
    ['CONNECT', req('CONNECT a:443 HTTP/1.1', 'Host: a:443\r\n'), 501],
    ['an unknown method', req('FOO / HTTP/1.1'), 501],
    ['a lower-case method', req('get / HTTP/1.1'), 501],
    ['TRACE', req('TRACE / HTTP/1.1'), 501],
    ['a head whose lines end in bare LF', 'GET / HTTP/1.1\nHost: a\n\n', 400],
    ['a bare LF between CRLF field lines', 'GET / HTTP/1.1\r\nHost: a\nX: y\r\n', 400],
    ["Host '['", req('GET / HTTP/1.1', 'Host: [\r\n'), 400],
    ["Host '%'", req('GET / HTTP/1.1', 'Host: %\r\n'), 400],
    ["Host 'a%zz'", req('GET / HTTP/1.1', 'Host: a%zz\r\n'), 400],
    ["Host 'a:b:c'", req('GET / HTTP/1.1', 'Host: a:b:c\r\n'), 400],
    ["Host ':80'", req('GET / HTTP/1.1', 'Host: :80\r\n'), 400],
    ["Host '127.0.0.1:99999'", req('GET / HTTP/1.1', 'Host: 127.0.0.1:99999\r\n'), 400],
    ["Host 'a:123456'", req('GET / HTTP/1.1', 'Host: a:123456\r\n'), 400],
    ["Host '[::1'", req('GET / HTTP/1.1', 'Host: [::1\r\n'), 400],
    ["absolute-form authority 'a:b:c'", req('GET http://a:b:c/ HTTP/1.1', 'Host: a:b:c\r\n'), 400],
    [
      'Expect: something else',
      req('POST / HTTP/1.1', 'Host: a\r\nExpect: 200-ok\r\nContent-Length: 1\r\n', 'x'),
      417,
    ],
    ['too many empty lines first', `\r\n\r\n\r\n\r\n\r\n${req('GET / HTTP/1.1')}`, 400],
    ['a bare CR first', `\r${req('GET / HTTP/1.1')}`, 400],
  ]

  test.each(cases)('%s → %i (whole)', (_name, raw, status) => {
    expect(refusal(raw)).toBe(status)
  })

  test.each(cases)('%s → %i (byte by byte)', (_name, raw, status) => {
    expect(refusal(raw, 1)).toBe(status)
  })

  test('the controls are accepted (so each refusal above tests one thing)', () => {
    expect(refusal(req('GET / HTTP/1.1', 'Host: a\r\nX: y\r\n'))).toBe(0)
    expect(refusal(chunked('3;a=b\r\nabc\r\n0\r\nX: y\r\n\r\n'))).toBe(0)
    expect(refusal(chunked('000000000003\r\nabc\r\n0\r\n\r\n'))).toBe(0)
    expect(refusal(req('GET http://a/ HTTP/1.1', 'Host: a\r\n'))).toBe(0)
    for (const path of ['/a.b', '/..a', '/a/...', '/.well-known/x', '/a/b.', '/x?p=/../'])
      expect(refusal(req(`GET ${path} HTTP/1.1`))).toBe(0)
    for (const host of ['', 'gpu', 'a:65535', '[::1]:8080', '127.0.0.1:99', 'a%41.b', 'x_y.example:1'])
      expect(refusal(req('GET / HTTP/1.1', `Host: ${host}\r\n`))).toBe(0)
    for (const method of ['PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS'])
      expect(refusal(req(`${method} / HTTP/1.1`))).toBe(0)
    expect(refusal(req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 1\r\n', 'x'))).toBe(0)
    expect(
      refusal(req('POST / HTTP/1.1', 'Host: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n', 'x')),
    ).toBe(0)
  })

  test('Content-Length over maxBodyBytes → 413 from the head alone', () => {
    const p = new RequestParser({ maxBodyBytes: 10 })
    p.push(bytes(req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 11\r\n')))
    expect(() => p.next()).toThrow(new RequestError(413, 'request body too large'))
    expect(
      refusal(req('POST / HTTP/1.1', 'Host: a\r\nContent-Length: 10\r\n', '0123456789'), 1, {
        maxBodyBytes: 10,
      }),
    ).toBe(0)
  })

  test('bodyLimit lowers the limit per request head: Content-Length and chunked alike', () => {
    const limits = { maxBodyBytes: 100, bodyLimit: (h: { path: string }) => (h.path === '/small' ? 4 : 1000) }
    expect(refusal(req('POST /small HTTP/1.1', 'Host: a\r\nContent-Length: 5\r\n', '01234'), 1, limits)).toBe(
      413,
    )
    expect(refusal(chunked('3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n', '/small'), 1, limits)).toBe(413)
    expect(refusal(req('POST /small HTTP/1.1', 'Host: a\r\nContent-Length: 4\r\n', '0123'), 1, limits)).toBe(
      0,
    )
    // It never raises maxBodyBytes.
    expect(refusal(req('POST /big HTTP/1.1', 'Host: a\r\nContent-Length: 101\r\n'), 1, limits)).toBe(413)
  })

  test('a chunked body over maxBodyBytes → 413 as soon as a size exceeds it, before its data', () => {
    const limits = { maxBodyBytes: 10 }
    const p = new RequestParser(limits)
    p.push(bytes(chunked('6\r\nabcdef\r\n4\r\nabcd\r\n5')))
    expect(() => p.next()).toThrow(new RequestError(413, 'request body too large'))
    expect(refusal(chunked('6\r\nabcdef\r\n4\r\nabcd\r\n0\r\n\r\n'), 1, limits)).toBe(0)
  })

  test('a head over maxHeadBytes without its end → 431, whole or byte by byte', () => {
    const limits = { maxHeadBytes: 100 }
    const long = `GET /${'a'.repeat(120)}`
    expect(refusal(long, long.length, limits)).toBe(431)
    expect(refusal(long, 1, limits)).toBe(431)
    // maxHeadBytes bytes without CRLFCRLF can no longer make a head that fits.
    expect(refusal(`GET /${'a'.repeat(95)}`, 1000, limits)).toBe(431)
    expect(refusal(`GET /${'a'.repeat(94)}`, 1000, limits)).toBe(0)
    expect(refusal(`GET /${'a'.repeat(90)} HTTP/1.1\r\nHost: a\r\n\r\n`, 1000, limits)).toBe(431)
    // 100 bytes exactly, CRLFCRLF included, is within the limit.
    const fits = `GET /${'a'.repeat(73)} HTTP/1.1\r\nHost: a\r\n\r\n`
    expect(fits.length).toBe(100)
    expect(feed(fits, 1, limits)).toHaveLength(1)
    expect(refusal(`G${fits}`, fits.length + 1, limits)).toBe(431)
  })

  test('a head under maxHeadBytes that is still incomplete waits for more', () => {
    const p = new RequestParser({ maxHeadBytes: 100 })
    p.push(bytes('GET / HTTP/1.1\r\nHost: a\r\n'))
    expect(p.next()).toBeNull()
    expect(p.buffered).toBe(25)
    p.push(bytes('\r\n'))
    expect(p.next()!.head.path).toBe('/')
  })

  test('more than maxHeaders fields → 431', () => {
    const fields = 'Host: a\r\nA: 1\r\nB: 2\r\n'
    expect(refusal(req('GET / HTTP/1.1', fields), 1000, { maxHeaders: 3 })).toBe(0)
    expect(refusal(req('GET / HTTP/1.1', `${fields}C: 3\r\n`), 1000, { maxHeaders: 3 })).toBe(431)
  })

  test('chunk extensions and trailers share maxHeadBytes → 431', () => {
    const limits = { maxHeadBytes: 200 }
    const trailers = (n: number) => chunked(`0\r\n${'X: 0123456789\r\n'.repeat(n)}\r\n`)
    // 13 bytes a trailer line (its CRLF not counted): 15 lines are 195 bytes, 16 are 208.
    expect(refusal(trailers(15), 1000, limits)).toBe(0)
    expect(refusal(trailers(16), 1000, limits)).toBe(431)
    expect(refusal(trailers(16), 1, limits)).toBe(431)
    expect(refusal(chunked(`1;${'e'.repeat(300)}\r\na\r\n0\r\n\r\n`), 1000, limits)).toBe(431)
  })
})

if (process.env.BENCH) {
  // BENCH=1 bun test test/wire/request-parser.test.ts -t benchmark
  test('benchmark: ns per parse of a ~250-byte POST with a 70-byte JSON body', () => {
    const json = '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'.slice(0, 70)
    const raw = bytes(
      'POST /v1/chat/completions HTTP/1.1\r\nHost: 10.0.0.1:8080\r\nUser-Agent: OpenAI/Python 1.54.0\r\n' +
        'Accept: application/json\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-0123456789\r\n' +
        `Content-Length: 70\r\n\r\n${json}`,
    )
    const p = new RequestParser()
    let best = Number.POSITIVE_INFINITY
    for (let round = 0; round < 40; round++) {
      const n = 50_000
      const t0 = Bun.nanoseconds()
      for (let i = 0; i < n; i++) {
        p.push(raw)
        if (p.next()!.body.length !== 70) throw new Error('bad parse')
      }
      best = Math.min(best, (Bun.nanoseconds() - t0) / n)
    }
    console.log(`${raw.length}-byte request: ${best.toFixed(0)} ns/parse (best of 40 rounds)`)
  })
}
