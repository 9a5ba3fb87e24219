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
 * key. The lookup allocates nothing but the string it looks up.
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

/**
 * Hmac32: HMAC-SHA256 (RFC 2104) of 32-byte messages under one key, computed in buffers made once:
 * two one-shot SHA-256 over (key ⊕ ipad ‖ message) and (key ⊕ opad ‖ inner hash). No hasher object
 * and no allocation per message (a hasher object per lookup held native memory until collected).
 */
export class Hmac32 {
  /** key ⊕ ipad (64 bytes), then the message (32). */
  private readonly inner = new Uint8Array(96)
  /** key ⊕ opad (64 bytes), then the inner hash (32). */
  private readonly outer = new Uint8Array(96)
  /** Where the message goes, and where the inner hash goes: views made once. */
  readonly message = this.inner.subarray(64)
  private readonly innerHash = this.outer.subarray(64)

  constructor(key: Uint8Array) {
    if (key.length > 64) throw new RangeError('Hmac32 takes a key of at most 64 bytes')
    for (let i = 0; i < 64; i++) {
      const k = key[i] ?? 0
      this.inner[i] = k ^ 0x36
      this.outer[i] = k ^ 0x5c
    }
  }

  /** digestInto: the HMAC of `message` (set it first, or pass it) written into `out` (32 bytes). */
  digestInto(out: Uint8Array, message?: Uint8Array): Uint8Array {
    if (message) this.message.set(message)
    Bun.SHA256.hash(this.inner, this.innerHash)
    Bun.SHA256.hash(this.outer, out)
    return out
  }
}

/**
 * Tagged: what KeyIndex holds: its entry carries the second half of its tag (`tag`), checked on
 * every lookup, so a map keyed by numbers (no string made per lookup) still matches 96 bits.
 */
export interface Tagged {
  tag: number
}

/**
 * KeyIndex: in-memory keys by the HMAC of their digest with this process's own random key: its
 * first 48 bits key a map of numbers, its next 48 bits are checked on the entry (96 bits in all,
 * which no guess can hit). Two of a host's keys sharing the first 48 bits (about one chance in
 * 10^5 for 100,000 keys) share a slot as a short list. A lookup allocates nothing.
 */
export class KeyIndex<T extends Tagged> {
  private readonly hmac = new Hmac32(randomBytes(32))
  private readonly map = new Map<number, T | T[]>()
  private count = 0
  private readonly out = Buffer.alloc(32)
  private readonly fromHex = Buffer.alloc(32)

  get size(): number {
    return this.count
  }

  /** ensure: the entry of a stored digest (hex), made by `make` when there is none. */
  ensure(digest: string, make: () => T): T {
    this.storedTag(digest)
    const found = this.lookup()
    if (found) return found
    const value = make()
    value.tag = this.check()
    const slot = this.slot()
    const there = this.map.get(slot)
    if (there === undefined) this.map.set(slot, value)
    else if (Array.isArray(there)) there.push(value)
    else this.map.set(slot, [there, value])
    this.count++
    return value
  }

  delete(digest: string): void {
    this.storedTag(digest)
    const slot = this.slot()
    const check = this.check()
    const there = this.map.get(slot)
    if (there === undefined) return
    if (!Array.isArray(there)) {
      if (there.tag !== check) return
      this.map.delete(slot)
    } else {
      const i = there.findIndex((e) => e.tag === check)
      if (i < 0) return
      there.splice(i, 1)
      if (there.length === 1) this.map.set(slot, there[0]!)
    }
    this.count--
  }

  /** get: the entry of a stored digest (hex). */
  get(digest: string): T | undefined {
    this.storedTag(digest)
    return this.lookup()
  }

  *values(): IterableIterator<T> {
    for (const v of this.map.values()) {
      if (Array.isArray(v)) yield* v
      else yield v
    }
  }

  /** find: the entry of a presented secret, or undefined (its digest goes straight into the HMAC's buffer). */
  find(secret: string): T | undefined {
    Bun.SHA256.hash(secret, this.hmac.message)
    this.hmac.digestInto(this.out)
    return this.lookup()
  }

  /** storedTag: the tag of a stored digest, into `out`. */
  private storedTag(digest: string): void {
    this.fromHex.write(digest, 'hex')
    this.hmac.digestInto(this.out, this.fromHex)
  }

  private slot(): number {
    return this.out.readUIntBE(0, 6)
  }

  private check(): number {
    return this.out.readUIntBE(6, 6)
  }

  /** lookup: the entry whose tag is the one in `out`. */
  private lookup(): T | undefined {
    const there = this.map.get(this.slot())
    if (there === undefined) return undefined
    const check = this.check()
    if (!Array.isArray(there)) return there.tag === check ? there : undefined
    return there.find((e) => e.tag === check)
  }
}
