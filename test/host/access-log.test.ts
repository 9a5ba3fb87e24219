import { describe, expect, it } from 'bun:test'
import { accessLevel } from '../../src/host/host.ts'

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
