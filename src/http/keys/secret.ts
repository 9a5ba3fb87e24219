import { randomBytes } from 'node:crypto'

/**
 * An inference key's secret and what is kept of it. The secret is `mg-` and 32 random bytes in
 * base64url (256 bits): shown once, in the answer that creates the key, and never again. What is
 * stored, and sent between pods, is its SHA-256 (`digest`): with 256 random bits behind it, the digest
 * cannot be turned back into the secret, and a copy of the database opens nothing.
 *
 * A request's key is found in memory (KeyIndex) by a keyed hash: HMAC-SHA256 of its digest with a
 * random key made when the process starts, which never leaves it. Whatever a map lookup's time
 * depends on (a hash bucket, the bytes of a near match) is then a function of values an outsider
 * can neither compute nor choose, so timing answers to wrong keys teaches nothing about any real
 * key. The lookup allocates nothing but the hash's own output.
 */
export const SECRET_PREFIX = 'mg-'
/** Bytes of randomness in a secret. */
export const SECRET_BYTES = 32

/** newSecret: a fresh secret (`mg-` + 43 base64url characters). */
export function newSecret(): string {
  return SECRET_PREFIX + randomBytes(SECRET_BYTES).toString('base64url')
}

/** digestOf: the SHA-256 of a secret, hex (what is stored). */
export function digestOf(secret: string): string {
  return Bun.SHA256.hash(secret, 'hex')
}

/** KeyIndex: in-memory keys by the HMAC of their digest with this process's own random key. */
export class KeyIndex<T> {
  private readonly pepper = randomBytes(32)
  private readonly map = new Map<string, T>()
  /** A reused buffer for the digest of a presented secret. */
  private readonly scratch = new Uint8Array(32)
  private readonly fromHex = Buffer.alloc(32)

  get size(): number {
    return this.map.size
  }

  /** set: the entry of a stored digest (hex). */
  set(digest: string, value: T): void {
    this.map.set(this.tag(this.hexBytes(digest)), value)
  }

  delete(digest: string): void {
    this.map.delete(this.tag(this.hexBytes(digest)))
  }

  /** find: the entry of a presented secret, or undefined. */
  find(secret: string): T | undefined {
    return this.map.get(this.tag(Bun.SHA256.hash(secret, this.scratch) as Uint8Array))
  }

  private hexBytes(digest: string): Uint8Array {
    this.fromHex.write(digest, 'hex')
    return this.fromHex
  }

  private tag(digest: Uint8Array): string {
    return new Bun.CryptoHasher('sha256', this.pepper).update(digest).digest('latin1')
  }
}
