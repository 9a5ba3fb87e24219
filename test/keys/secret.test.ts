import { describe, expect, it } from 'bun:test'
import { createHash, createHmac, randomBytes } from 'node:crypto'
import { digestOf, Hmac32, KeyIndex, newSecret } from '../../src/http/keys/secret.ts'

describe('key secrets and their index', () => {
  it('a secret is mg- and 32 random bytes in base64url; what is kept is its SHA-256', () => {
    const s = newSecret()
    expect(s).toMatch(/^mg-[A-Za-z0-9_-]{43}$/)
    expect(Buffer.from(s.slice(3), 'base64url')).toHaveLength(32)
    expect(newSecret()).not.toBe(s)
    expect(digestOf(s)).toBe(createHash('sha256').update(s).digest('hex'))
  })

  it('Hmac32 is HMAC-SHA256, whatever the key and message', () => {
    for (let i = 0; i < 200; i++) {
      const key = randomBytes(1 + (i % 64))
      const message = randomBytes(32)
      const out = new Uint8Array(32)
      new Hmac32(key).digestInto(out, message)
      expect(Buffer.from(out).toString('hex')).toBe(createHmac('sha256', key).update(message).digest('hex'))
    }
  })

  it('finds a key by its secret, from its stored digest, and forgets it', () => {
    const index = new KeyIndex<{ tag: number; name: string }>()
    const secrets = Array.from({ length: 1000 }, newSecret)
    for (const [i, s] of secrets.entries()) index.ensure(digestOf(s), () => ({ tag: 0, name: `k${i}` }))
    expect(index.size).toBe(1000)
    expect(index.find(secrets[42]!)?.name).toBe('k42')
    expect(index.get(digestOf(secrets[7]!))?.name).toBe('k7')
    expect(index.find(newSecret())).toBeUndefined()
    expect(index.find(`${secrets[42]!.slice(0, -1)}x`)).toBeUndefined()
    // ensure keeps the entry that is there.
    expect(index.ensure(digestOf(secrets[3]!), () => ({ tag: 0, name: 'other' })).name).toBe('k3')
    index.delete(digestOf(secrets[42]!))
    expect(index.find(secrets[42]!)).toBeUndefined()
    expect(index.size).toBe(999)
    expect([...index.values()]).toHaveLength(999)
  })
})
