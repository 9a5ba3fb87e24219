import { describe, expect, it } from 'bun:test'
import { accessLevel } from '../../src/host/access-log.ts'
import { startHost } from '../support/host.ts'
import { parse, rawExchange } from '../support/raw-client.ts'
import { waitFor } from '../support/wait.ts'

describe('access log level', () => {
  it.each([
    [200, 'debug'],
    [304, 'debug'],
    [400, 'warn'],
    [404, 'warn'],
    [499, 'info'],
    [500, 'error'],
    [504, 'error'],
  ] as const)('status %d is logged at %s', (status, level) => {
    expect(accessLevel(status)).toBe(level)
  })
})

describe('access log redaction', () => {
  it('never writes an event-stream token or an OAuth callback code or state, through a real host', async () => {
    const th = await startHost('', [], {}, undefined, { logLevel: 'debug' })
    try {
      const secrets = { token: 'jwt-tok-3d1f', code: 'c0de-8a7b', state: 'st4te-91ce' }
      const res = await fetch(
        `${th.url}/api/auth/callback?code=${secrets.code}&state=${secrets.state}&token=${secrets.token}&keep=yes`,
      )
      await res.body?.cancel()
      await waitFor('the access line of the callback', () =>
        th.logs.find((l) => l.includes('GET /api/auth/callback?')),
      )
      const line = th.logs.find((l) => l.includes('GET /api/auth/callback?'))!
      for (const value of Object.values(secrets)) expect(line).not.toContain(value)
      expect(line).toContain('code=REDACTED')
      expect(line).toContain('state=REDACTED')
      expect(line).toContain('token=REDACTED')
      expect(line).toContain('keep=yes')
    } finally {
      await th.stop()
    }
  })
})

describe('client errors in the access log', () => {
  it('logs what the front refuses for the client at warn, never error, whatever the status', () => {
    expect(accessLevel(501, true)).toBe('warn')
    expect(accessLevel(505, true)).toBe('warn')
    expect(accessLevel(400, true)).toBe('warn')
  })

  it('writes at most 20 client-error lines a second and then says how many it left out, through a real host', async () => {
    const th = await startHost('', [], {}, undefined, { logLevel: 'debug' })
    try {
      const port = Number(new URL(th.url).port)
      // 200 requests with a method nobody implements (501), each on its own connection.
      const refused = await Promise.all(
        Array.from({ length: 200 }, () =>
          rawExchange(port, 'FOO / HTTP/1.1\r\nHost: a\r\n\r\n', {
            waitMs: 5000,
            until: (t) => parse(t).length === 1,
          }),
        ),
      )
      expect(refused.every((r) => parse(r.text)[0]!.status === 501)).toBe(true)
      const lines = () => th.logs.filter((l) => / 501\b/.test(l))
      expect(th.logs.filter((l) => /\bERROR\b|"level":"error"/i.test(l))).toEqual([])
      expect(lines().length).toBeGreaterThan(0)
      expect(lines().length).toBeLessThan(200)
      // Once a second has passed, the next client error carries the count of those left out.
      await waitFor(
        'a line that counts the refusals left out',
        async () => {
          await rawExchange(port, 'FOO / HTTP/1.1\r\nHost: a\r\n\r\n', {
            waitMs: 5000,
            until: (t) => parse(t).length === 1,
          })
          return th.logs.find((l) => l.includes('suppressed_client_errors'))
        },
        { timeoutMs: 10_000, pollMs: 250 },
      )
      const written = lines().length
      const left = th.logs
        .filter((l) => l.includes('suppressed_client_errors'))
        .map((l) => Number(/suppressed_client_errors[=:"]+(\d+)/.exec(l)?.[1]))
      expect(written + left.reduce((a, b) => a + b, 0)).toBeGreaterThanOrEqual(201)
    } finally {
      await th.stop()
    }
  })
})
