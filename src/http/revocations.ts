import { lte } from 'drizzle-orm'
import type { EventBus } from '../host/bus.ts'
import { revokedTokens } from '../store/core/schema.ts'
import type { Store } from '../store/db.ts'

/** Revocation: a logged-out token, by its `jti`, refused until its `exp` (Unix seconds). */
export interface Revocation {
  jti: string
  exp: number
}

/** Where revocations come from: a logout on this pod, or another pod's word (cluster plugin). */
export type RevocationOrigin = 'local' | 'peer'

declare module '../host/bus.ts' {
  interface BusEvents {
    /**
     * auth.revoked: tokens this pod refuses from now on that it did not refuse before: logged out
     * here (`local`: the cluster plugin tells the other pods) or learnt from another pod (`peer`).
     */
    'auth.revoked': { revocations: Revocation[]; origin: RevocationOrigin }
  }
}

/** The longest `jti` kept (modelgate's are UUIDs). */
export const MAX_JTI_LENGTH = 128
/** Rows written per INSERT (well under SQLite's bound-variable limit). */
const BATCH = 500

/**
 * RevocationBook: the logged-out tokens this pod refuses, each until its expiry. A map answers the
 * guard (every admin request asks); the `revoked_tokens` table of the data dir's SQLite keeps the
 * same set across a restart (loaded at attach). Expired entries are purged from both as new ones
 * arrive: a token past its exp is refused as expired anyway. No revocation outlives the longest
 * token the server accepts (now + `maxLifetimeSeconds`), so a peer's far-future exp cannot pin a
 * row forever.
 */
export class RevocationBook {
  private readonly memory = new Map<string, number>()
  private store: Store | null = null
  private bus: EventBus | null = null

  constructor(
    /** The longest a token may still be valid from now: jwt_ttl_seconds plus the clock skew. */
    private readonly maxLifetimeSeconds: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** attach: keep revocations in `store` (loading those still in force) and announce new ones on `bus`. */
  attach(store: Store, bus: EventBus): void {
    this.store = store
    this.bus = bus
    const nowSec = this.nowSec()
    store.db.delete(revokedTokens).where(lte(revokedTokens.expires_at, nowSec)).run()
    for (const row of store.db.select().from(revokedTokens).all()) this.memory.set(row.jti, row.expires_at)
  }

  /** has: whether the token `jti` is revoked (and not yet expired). */
  has(jti: string): boolean {
    const exp = this.memory.get(jti)
    return exp !== undefined && exp > this.nowSec()
  }

  /** list: every revocation still in force (what another pod learns when it (re)joins). */
  list(): Revocation[] {
    const nowSec = this.nowSec()
    const out: Revocation[] = []
    for (const [jti, exp] of this.memory) if (exp > nowSec) out.push({ jti, exp })
    return out
  }

  /**
   * add records revocations: those already known, expired or malformed are skipped. The new ones are
   * written to the store in one transaction, then announced (`auth.revoked`, with `origin`), and
   * returned.
   */
  add(revocations: readonly Revocation[], origin: RevocationOrigin): Revocation[] {
    const nowSec = this.nowSec()
    const latest = Math.ceil(nowSec + this.maxLifetimeSeconds)
    const fresh = new Map<string, number>()
    for (const r of revocations) {
      if (typeof r.jti !== 'string' || r.jti === '' || r.jti.length > MAX_JTI_LENGTH) continue
      if (!Number.isFinite(r.exp) || r.exp <= nowSec || this.has(r.jti)) continue
      fresh.set(r.jti, Math.min(Math.ceil(r.exp), latest))
    }
    if (fresh.size === 0) return []
    for (const [jti, exp] of this.memory) if (exp <= nowSec) this.memory.delete(jti)
    for (const [jti, exp] of fresh) this.memory.set(jti, exp)
    const added = [...fresh].map(([jti, exp]) => ({ jti, exp }))
    this.persist(added, nowSec)
    this.bus?.emit('auth.revoked', { revocations: added, origin })
    return added
  }

  private persist(added: Revocation[], nowSec: number): void {
    const store = this.store
    if (!store) return
    store.sqlite.transaction(() => {
      store.db.delete(revokedTokens).where(lte(revokedTokens.expires_at, nowSec)).run()
      for (let i = 0; i < added.length; i += BATCH) {
        const rows = added.slice(i, i + BATCH).map((r) => ({ jti: r.jti, expires_at: r.exp }))
        store.db.insert(revokedTokens).values(rows).onConflictDoNothing().run()
      }
    })()
  }

  private nowSec(): number {
    return this.now() / 1000
  }
}
