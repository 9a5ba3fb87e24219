import { describe, expect, it } from 'bun:test'
import { accessLevel } from '../../src/host/host.ts'
import { startHost } from '../support/host.ts'
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
