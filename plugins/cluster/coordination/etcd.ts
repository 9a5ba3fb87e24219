import { abortable } from '../../../src/host/abortable.ts'
import type { Logger } from '../../../src/host/logger.ts'
import type { ClusterConfig } from '../config.ts'
import { EtcdClient, type WatchEvent } from './etcd-client.ts'
import { EtcdSession } from './etcd-session.ts'
import { PrefixMirror, waitDelete } from './etcd-watch.ts'
import type { Coordinator, CoordinatorChange, CoordinatorOptions, Leadership, Peer } from './types.ts'

/**
 * EtcdCoordinator: leadership and membership borrowed from etcd, as etcd's own
 * `client/v3/concurrency` does it (a Session: one lease kept alive; an Election: one key per
 * session under a prefix, the lowest create revision leads). Keys, under `<prefix>/<cluster_id>`:
 *
 * - `election/<lease id in hex>` = {podId, address}, under the session lease. Campaign is
 *   concurrency.Election.Campaign: a txn puts the key if it does not exist, then the pod waits
 *   until every key with a lower create revision is deleted. The term is the winning key's create
 *   revision: revisions only grow, so a later leader always has a higher term.
 * - `pods/<pod id>` = {podId, address}, under the same lease: peers are a range and a watch of it.
 *
 * Fencing: this pod counts itself leader only while its session is fresh (EtcdSession: the last
 * successful keepalive is younger than the renew deadline, 2/3 of the TTL), so a paused or
 * partitioned leader stops acting before etcd can hand leadership to another; `leadership()`
 * computes it when read. A session whose lease is gone (keepalive answers TTL 0, or its election
 * key was deleted) is replaced by a new one, which registers and campaigns again with a new key.
 */
type EtcdConfig = ClusterConfig['coordination']['etcd']

const RETRY_MS = 500

const message = (err: unknown): string => (err instanceof Error ? err.message : String(err))

function parsePeer(value: string): Peer | undefined {
  try {
    const v = JSON.parse(value) as Partial<Peer>
    if (typeof v.podId === 'string' && typeof v.address === 'string')
      return { podId: v.podId, address: v.address }
  } catch {}
  return undefined
}

export class EtcdCoordinator implements Coordinator {
  readonly kind = 'etcd'
  private readonly client: EtcdClient
  private readonly log: Logger
  private readonly now: () => number
  private readonly self: Peer
  private readonly electionPrefix: string
  private readonly podKey: string
  private readonly pods: PrefixMirror
  private readonly election: PrefixMirror
  private readonly listeners = new Set<(change: CoordinatorChange) => void>()
  private readonly shown = { leadership: '', peers: '' }
  private readonly stopping = new AbortController()
  private session: EtcdSession | undefined
  /** keyRevision: the create revision of the current session's election key, once campaigned. */
  private keyRevision = 0
  private elected: { session: EtcdSession; term: number } | undefined
  private started = false
  private loop: Promise<void> | undefined
  private stopped: Promise<void> | undefined

  constructor(
    private readonly cfg: EtcdConfig,
    clusterId: string,
    opts: CoordinatorOptions & { now?: () => number },
  ) {
    this.client = new EtcdClient({
      endpoints: cfg.endpoints,
      timeoutMs: cfg.request_timeout_ms,
      ...(cfg.username !== undefined ? { username: cfg.username, password: cfg.password ?? '' } : {}),
    })
    this.log = opts.log
    this.now = opts.now ?? Date.now
    this.self = { podId: opts.podId, address: opts.address }
    const base = `${cfg.prefix.replace(/\/+$/, '')}/${clusterId}`
    this.electionPrefix = `${base}/election/`
    this.podKey = `${base}/pods/${opts.podId}`
    const trouble = (err: unknown) =>
      this.log.debug('etcd watch interrupted; resuming', { error: message(err) })
    this.pods = new PrefixMirror(this.client, `${base}/pods/`, () => this.notify(), trouble)
    this.election = new PrefixMirror(
      this.client,
      this.electionPrefix,
      (c, rev) => this.onElection(c, rev),
      trouble,
    )
  }

  async start(): Promise<void> {
    if (this.started || this.stopping.signal.aborted) throw new Error('the etcd coordinator starts only once')
    this.started = true
    let first: EtcdSession
    try {
      first = await this.openSession()
      await this.pods.start(this.stopping.signal)
      await this.election.start(this.stopping.signal)
    } catch (err) {
      await this.stop(AbortSignal.timeout(this.cfg.request_timeout_ms))
      throw new Error(`cluster coordination: etcd (${this.client.endpoints}) unusable: ${message(err)}`, {
        cause: err,
      })
    }
    this.loop = this.run(first)
    this.notify()
  }

  stop(deadline: AbortSignal): Promise<void> {
    if (!this.stopped) {
      this.stopping.abort()
      this.stopped = this.shutdown(deadline)
    }
    return this.stopped
  }

  leadership(): Leadership {
    const e = this.elected
    if (e && e.session === this.session && !e.session.signal.aborted) {
      const isLeader = e.session.fresh()
      return { leaderId: this.self.podId, leaderAddress: this.self.address, term: e.term, isLeader }
    }
    let first: { createRevision: number; value: string } | undefined
    for (const kv of this.election.kvs.values())
      if (!first || kv.createRevision < first.createRevision) first = kv
    if (!first) return { leaderId: null, leaderAddress: null, term: 0, isLeader: false }
    const p = parsePeer(first.value)
    return {
      leaderId: p?.podId ?? null,
      leaderAddress: p?.address ?? null,
      term: first.createRevision,
      isLeader: false,
    }
  }

  peers(): Peer[] {
    const peers: Peer[] = []
    for (const kv of this.pods.kvs.values()) {
      const p = parsePeer(kv.value)
      if (p) peers.push(p)
    }
    return peers.sort((a, b) => (a.podId < b.podId ? -1 : a.podId > b.podId ? 1 : 0))
  }

  subscribe(fn: (change: CoordinatorChange) => void): () => void {
    this.listeners.add(fn)
    return () => this.listeners.delete(fn)
  }

  /** run: one session after another until stop: campaign, lead or follow, and begin again when the lease is lost. */
  private async run(first: EtcdSession): Promise<void> {
    let s: EtcdSession | undefined = first
    while (!this.stopping.signal.aborted) {
      try {
        s ??= await this.openSession()
        await this.campaign(s)
        if (!s.signal.aborted) {
          this.elected = { session: s, term: this.keyRevision }
          this.log.info('elected cluster leader', { term: this.keyRevision, lease: s.leaseHex })
          this.notify()
        }
        await s.lost
      } catch (err) {
        if (this.stopping.signal.aborted) return
        if (!s?.signal.aborted) this.log.warn('etcd session failed; retrying', { error: message(err) })
      }
      if (this.stopping.signal.aborted) return
      if (s) {
        this.lose(s, 'replaced')
        await s.revoke({ signal: this.stopping.signal }).catch(() => {})
      }
      s = undefined
      await this.pause(RETRY_MS, this.stopping.signal)
    }
  }

  /** openSession grants a lease and registers this pod under it. */
  private async openSession(): Promise<EtcdSession> {
    const signal = this.stopping.signal
    const ttl = {
      ttlSeconds: this.cfg.session_ttl_seconds,
      requestTimeoutMs: this.cfg.request_timeout_ms,
      now: this.now,
    }
    const s: EtcdSession = await EtcdSession.open(
      this.client,
      ttl,
      {
        changed: () => this.notify(),
        expired: () => this.lose(s, 'its lease expired'),
        recovered: () => {
          this.log.info('etcd reachable again', { lease: s.leaseHex })
          this.pods.restart()
          this.election.restart()
        },
        trouble: (err) => this.log.warn('etcd keepalive failed', { lease: s.leaseHex, error: message(err) }),
      },
      { signal },
    )
    try {
      await this.client.put(this.podKey, JSON.stringify(this.self), s.lease, { signal })
    } catch (err) {
      await s.revoke().catch(() => {})
      throw err
    }
    this.session = s
    this.keyRevision = 0
    this.notify()
    return s
  }

  private keyOf(s: EtcdSession): string {
    return this.electionPrefix + s.leaseHex
  }

  /** campaign is concurrency.Election.Campaign; it resolves when this session's key is the lowest. */
  private async campaign(s: EtcdSession): Promise<void> {
    const key = this.keyOf(s)
    for (;;) {
      try {
        const r = await this.client.txn(
          {
            compare: [{ key, target: 'CREATE', result: 'EQUAL', value: 0 }],
            success: [{ put: { key, value: JSON.stringify(this.self), lease: s.lease } }],
            failure: [{ range: { key } }],
          },
          { signal: s.signal },
        )
        const rev = r.succeeded ? r.revision : (r.responses[0]?.kvs?.[0]?.createRevision ?? 0)
        if (!rev) throw new Error(`election key ${key} has no create revision`)
        if (s === this.session) this.keyRevision = rev
        await this.waitDeletes(rev - 1, s.signal)
        return
      } catch (err) {
        if (s.signal.aborted) throw err
        this.log.warn('etcd campaign interrupted; retrying', { error: message(err) })
        await this.pause(RETRY_MS, s.signal)
      }
    }
  }

  /** waitDeletes waits until no election key has a create revision ≤ `maxCreateRevision` (concurrency's waitDeletes). */
  private async waitDeletes(maxCreateRevision: number, signal: AbortSignal): Promise<void> {
    for (;;) {
      const r = await this.client.range(
        this.electionPrefix,
        { prefix: true, sort: { target: 'CREATE', order: 'DESCEND' }, limit: 1, maxCreateRevision },
        { signal },
      )
      const last = r.kvs[0]
      if (!last) return
      await waitDelete(this.client, last.key, r.revision, signal)
    }
  }

  /** lose ends a session (lease gone, key deleted, stopping); the run loop starts the next one. */
  private lose(s: EtcdSession, why: string): void {
    if (!s.end()) return
    if (this.elected?.session === s) this.elected = undefined
    if (!this.stopping.signal.aborted)
      this.log.warn('etcd session ended; campaigning again with a new lease', { lease: s.leaseHex, why })
    this.notify()
  }

  private onElection(change: WatchEvent[] | 'reset', revision: number): void {
    const s = this.session
    if (s && !s.signal.aborted) {
      const key = this.keyOf(s)
      const gone =
        change === 'reset'
          ? this.keyRevision > 0 && revision >= this.keyRevision && !this.election.kvs.has(key)
          : change.some((e) => e.type === 'delete' && e.kv.key === key)
      if (gone) this.lose(s, 'its election key was deleted')
    }
    this.notify()
  }

  private async shutdown(deadline: AbortSignal): Promise<void> {
    if (this.session) this.lose(this.session, 'stopping')
    await abortable(this.loop ?? Promise.resolve(), { signal: deadline }).catch(() => {})
    const s = this.session
    if (s) {
      this.lose(s, 'stopping')
      try {
        const key = this.keyOf(s)
        if (this.keyRevision > 0)
          await this.client.txn(
            {
              compare: [{ key, target: 'CREATE', result: 'EQUAL', value: this.keyRevision }],
              success: [{ deleteRange: { key } }],
            },
            { signal: deadline },
          )
        await s.revoke({ signal: deadline })
      } catch (err) {
        this.log.warn('etcd lease not revoked; it expires after its TTL', {
          lease: s.leaseHex,
          error: message(err),
        })
      }
    }
    await Promise.all([this.pods.stop(), this.election.stop()])
    this.client.close()
    this.notify()
  }

  private async pause(ms: number, signal: AbortSignal): Promise<void> {
    const done = Promise.withResolvers<void>()
    const t = setTimeout(done.resolve, ms)
    await abortable(done.promise, { signal }).catch(() => {})
    clearTimeout(t)
  }

  private notify(): void {
    const leadership = this.leadership()
    const lk = JSON.stringify(leadership)
    if (lk !== this.shown.leadership) {
      this.shown.leadership = lk
      this.emit({ type: 'leadership', leadership })
    }
    const peers = this.peers()
    const pk = JSON.stringify(peers)
    if (pk !== this.shown.peers) {
      this.shown.peers = pk
      this.emit({ type: 'peers', peers })
    }
  }

  private emit(change: CoordinatorChange): void {
    for (const fn of this.listeners) {
      try {
        fn(change)
      } catch (err) {
        this.log.error('coordinator subscriber failed', { error: message(err) })
      }
    }
  }
}
