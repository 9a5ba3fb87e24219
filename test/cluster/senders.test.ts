import { describe, expect, it } from 'bun:test'
import { ClusterSenders, canonicalIp, RESOLVE_EVERY_MS } from '../../plugins/cluster/senders.ts'
import { Logger } from '../../src/host/logger.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Who may send internal requests, as the head stage asks it (the sockets' side is
 * internal-head.test.ts): the pod named must be a member, and the address the one it advertises.
 * The membership and the resolver are stand-ins the test drives, and so is the clock.
 */
const log = new Logger('error', 'test', 'text', () => {})

function senders(members: Record<string, string>, o: { checkAddress?: boolean } = {}) {
  let clock = 1_000_000
  const answers = new Map<string, string[] | Error>()
  const asked: string[] = []
  const s = new ClusterSenders({
    members: {
      address: (id) => members[id],
      peers: () => Object.entries(members).map(([podId, address]) => ({ podId, address })),
    },
    checkAddress: o.checkAddress ?? true,
    log,
    now: () => clock,
    resolve: async (host) => {
      asked.push(host)
      const a = answers.get(host)
      if (a === undefined || a instanceof Error) throw a ?? new Error('NXDOMAIN')
      return a
    },
  })
  return {
    s,
    answers,
    asked,
    tick: (ms: number) => {
      clock += ms
    },
  }
}

const code = (e: { code: string } | null) => e?.code ?? null

describe('cluster senders', () => {
  it('spells every address one way: IPv4-mapped IPv6 as IPv4, IPv6 compressed, brackets off', () => {
    expect(canonicalIp('10.0.0.5')).toBe('10.0.0.5')
    expect(canonicalIp('::ffff:10.0.0.5')).toBe('10.0.0.5')
    expect(canonicalIp('::FFFF:a00:5')).toBe('10.0.0.5')
    expect(canonicalIp('[2001:DB8:0:0:0:0:0:1]')).toBe('2001:db8::1')
    expect(canonicalIp('gpu-1.lan')).toBeNull()
  })

  it('refuses a missing or unknown pod, and one of its addresses from anywhere else', () => {
    const { s } = senders({ a: 'http://10.0.0.5:3000', v6: 'http://[2001:db8::1]:3000' })
    expect(s.check(null, '10.0.0.5')?.status).toBe(401)
    expect(code(s.check('mallory', '10.0.0.5'))).toBe('UNKNOWN_POD')
    expect(s.check('a', '10.0.0.5')).toBeNull()
    expect(s.check('a', '::ffff:10.0.0.5')).toBeNull()
    expect(code(s.check('a', '10.0.0.6'))).toBe('WRONG_SOURCE_ADDRESS')
    expect(s.check('v6', '2001:db8:0::1')).toBeNull()
    expect(code(s.check('v6', '10.0.0.5'))).toBe('WRONG_SOURCE_ADDRESS')
  })

  it('does not check a member advertising an unspecified address, or any when told not to', () => {
    expect(senders({ a: 'http://0.0.0.0:3000' }).s.check('a', '192.0.2.7')).toBeNull()
    const off = senders({ a: 'http://10.0.0.5:3000' }, { checkAddress: false }).s
    expect(off.check('a', '192.0.2.7')).toBeNull()
    expect(code(off.check('mallory', '10.0.0.5'))).toBe('UNKNOWN_POD')
  })

  it('resolves a host name at membership time, answers 503 until it has, and keeps the last answer through a failure', async () => {
    const t = senders({ a: 'http://gpu-1.lan:3000' })
    t.answers.set('gpu-1.lan', ['10.0.0.5'])
    // start sweeps the membership: the name is being resolved before any request names the pod.
    t.s.start()
    expect(t.asked).toEqual(['gpu-1.lan'])
    // Until the answer is in: 503, never a wait on DNS.
    const early = t.s.check('a', '10.0.0.5')
    expect(early?.status).toBe(503)
    expect(early?.headers['retry-after']).toBe('1')
    await waitFor('gpu-1.lan resolved', () => t.s.check('a', '10.0.0.5') === null, { timeoutMs: 2000 })
    expect(code(t.s.check('a', '10.0.0.6'))).toBe('WRONG_SOURCE_ADDRESS')
    // Past RESOLVE_EVERY_MS it is resolved again in the background; a failure keeps the last answer.
    t.answers.set('gpu-1.lan', new Error('SERVFAIL'))
    t.tick(RESOLVE_EVERY_MS)
    const asked = t.asked.length
    expect(t.s.check('a', '10.0.0.5')).toBeNull()
    await waitFor('the name asked again', () => t.asked.length > asked, { timeoutMs: 2000 })
    expect(t.s.check('a', '10.0.0.5')).toBeNull()
    // A new answer replaces the old one.
    t.answers.set('gpu-1.lan', ['10.0.0.9'])
    t.tick(RESOLVE_EVERY_MS)
    t.s.check('a', '10.0.0.5')
    await waitFor('the new answer taken', () => t.s.check('a', '10.0.0.9') === null, { timeoutMs: 2000 })
    expect(code(t.s.check('a', '10.0.0.5'))).toBe('WRONG_SOURCE_ADDRESS')
    t.s.stop()
  })
})
