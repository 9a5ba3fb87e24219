import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { parse, rawExchange } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'
import { FakeGateway, type ProxyHost, startProxyHost } from './support.ts'

/**
 * A request the front refuses from its head (its key, its method, its HTTP version, its size) is
 * logged with the method it was sent with, like any request; only a request whose method is no
 * token, or that never sent a whole request line, is logged with `-`. Raw sockets to a real host,
 * the log lines captured as written.
 */
const KEY = 'sk-access-log-refused'
const lines: string[] = []
let px: ProxyHost
let port = 0

beforeAll(async () => {
  px = await startProxyHost(new FakeGateway(), {
    env: { INFERENCE_API_KEY: KEY },
    logLevel: 'warn',
    logSink: (l) => lines.push(l),
  })
  port = Number(new URL(px.url).port)
})

afterAll(async () => {
  await px?.stop()
})

/** refusedLine: sends `bytes` on a new connection, expects `status`, returns the access line of `path` with it. */
async function refusedLine(bytes: string, status: number, path: string): Promise<string> {
  const reply = await rawExchange(port, bytes, { waitMs: 5000, until: (t) => parse(t).length === 1 })
  expect(parse(reply.text)[0]!.status).toBe(status)
  const needle = ` ${path} ${status}`
  return await waitFor(`the access line of ${path} ${status}`, () => lines.find((l) => l.includes(needle)))
}

describe('access lines of requests refused from their head', () => {
  it.each([
    ['an inference request without the key (401)', 'POST', '/v1/chat/completions', 401, ''],
    ['an unknown method (501)', 'FOO', '/refused-501', 501, ''],
    ['an HTTP version it does not speak (505)', 'GET', '/refused-505', 505, ''],
    [
      'a body too large for the listener (413)',
      'POST',
      '/api/refused-413',
      413,
      'Content-Length: 99999999999\r\n',
    ],
  ])('%s names its method', async (_what, method, path, status, extra) => {
    const version = status === 505 ? 'HTTP/2.0' : 'HTTP/1.1'
    const line = await refusedLine(
      `${method} ${path} ${version}\r\nHost: a\r\nContent-Type: application/json\r\n${extra}\r\n`,
      status,
      path,
    )
    expect(line).toContain(`${method} ${path} ${status}`)
    expect(line).not.toContain(`- ${path}`)
  })

  it('names the method of a head too large (431)', async () => {
    const line = await refusedLine(
      `PUT /refused-431 HTTP/1.1\r\nHost: a\r\nX-Big: ${'x'.repeat(70_000)}\r\n\r\n`,
      431,
      '/refused-431',
    )
    expect(line).toContain('PUT /refused-431 431')
  })

  it('writes `-` for a method that is no token (400)', async () => {
    const line = await refusedLine('G(T /refused-400 HTTP/1.1\r\nHost: a\r\n\r\n', 400, '/refused-400')
    expect(line).toContain('- /refused-400 400')
    expect(line).not.toContain('G(T')
  })
})
