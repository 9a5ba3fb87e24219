import type { CallOptions, EtcdClient } from './etcd-client.ts'

/**
 * EtcdSession: one lease kept alive, as concurrency.Session does it (a keepalive every TTL/3), plus
 * the fencing that client-go's leader election has and concurrency leaves to its caller: a renew
 * deadline of 2/3 of the TTL. `fresh()` is true only while the last keepalive that succeeded was
 * sent less than the renew deadline ago (on the injected clock), so a pod that is paused or cut off
 * counts itself expired before etcd can let its lease go. It is computed when read; the deadline
 * timer only tells the owner (`changed`) so it can tell its subscribers.
 *
 * The session ends (`end()`; `signal` aborts, `lost` resolves) when its owner says so, which it
 * does when a keepalive answers that the lease is gone (`expired`).
 */
export interface SessionHooks {
  /** changed: a keepalive succeeded or failed, or the renew deadline passed. */
  changed(): void
  /** expired: etcd no longer knows the lease (it lapsed or was revoked); keepalives have stopped, the owner ends the session. */
  expired(): void
  /** recovered: a keepalive succeeded after failures (streams opened meanwhile may be half-open). */
  recovered(): void
  /** trouble: the first keepalive that failed, for a log line. */
  trouble(err: unknown): void
}

export interface SessionOptions {
  ttlSeconds: number
  requestTimeoutMs: number
  now: () => number
}

const RETRY_MS = 500

export class EtcdSession {
  readonly renewDeadlineMs: number
  private readonly keepAliveMs: number
  private readonly ctl = new AbortController()
  private readonly ended = Promise.withResolvers<void>()
  private failing = false
  private keepAliveTimer: ReturnType<typeof setTimeout> | undefined
  private deadlineTimer: ReturnType<typeof setTimeout> | undefined

  private constructor(
    private readonly client: EtcdClient,
    readonly lease: string,
    private renewedAt: number,
    private readonly o: SessionOptions,
    private readonly hooks: SessionHooks,
  ) {
    this.renewDeadlineMs = Math.floor((o.ttlSeconds * 2000) / 3)
    this.keepAliveMs = Math.floor((o.ttlSeconds * 1000) / 3)
    this.schedule(this.keepAliveMs)
    this.armDeadline()
  }

  /** open grants a lease of `ttlSeconds` and starts keeping it alive. */
  static async open(
    client: EtcdClient,
    o: SessionOptions,
    hooks: SessionHooks,
    call?: CallOptions,
  ): Promise<EtcdSession> {
    const sentAt = o.now()
    const { id } = await client.grant(o.ttlSeconds, call)
    return new EtcdSession(client, id, sentAt, o, hooks)
  }

  /** leaseHex: the lease ID as concurrency names its election key (`%x`). */
  get leaseHex(): string {
    return BigInt(this.lease).toString(16)
  }

  /** signal aborts when the session ends: work done for it (a campaign) stops. */
  get signal(): AbortSignal {
    return this.ctl.signal
  }

  get lost(): Promise<void> {
    return this.ended.promise
  }

  fresh(): boolean {
    return !this.ctl.signal.aborted && this.o.now() - this.renewedAt < this.renewDeadlineMs
  }

  /** end stops the keepalives and every timer; it answers false when the session had already ended. */
  end(): boolean {
    if (this.ctl.signal.aborted) return false
    this.ctl.abort()
    clearTimeout(this.keepAliveTimer)
    clearTimeout(this.deadlineTimer)
    this.ended.resolve()
    return true
  }

  /** revoke ends the session and deletes its lease (and the keys under it) in etcd. */
  async revoke(call?: CallOptions): Promise<void> {
    this.end()
    await this.client.revoke(this.lease, call)
  }

  private schedule(ms: number): void {
    clearTimeout(this.keepAliveTimer)
    this.keepAliveTimer = setTimeout(() => void this.keepAlive(), ms)
  }

  private armDeadline(): void {
    clearTimeout(this.deadlineTimer)
    const left = this.renewedAt + this.renewDeadlineMs - this.o.now()
    this.deadlineTimer = setTimeout(() => this.hooks.changed(), Math.max(0, left) + 1)
  }

  private async keepAlive(): Promise<void> {
    const sentAt = this.o.now()
    try {
      const timeoutMs = Math.min(this.o.requestTimeoutMs, this.keepAliveMs)
      const ttl = await this.client.keepAlive(this.lease, { signal: this.ctl.signal, timeoutMs })
      if (this.ctl.signal.aborted) return
      if (ttl <= 0) return this.hooks.expired()
      this.renewedAt = Math.max(this.renewedAt, sentAt)
      this.schedule(this.keepAliveMs)
      this.armDeadline()
      if (this.failing) {
        this.failing = false
        this.hooks.recovered()
      }
      this.hooks.changed()
    } catch (err) {
      if (this.ctl.signal.aborted) return
      if (!this.failing) this.hooks.trouble(err)
      this.failing = true
      this.schedule(Math.min(RETRY_MS, this.keepAliveMs))
      this.hooks.changed()
    }
  }
}
