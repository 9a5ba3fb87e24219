import { type ClusterConfig, LEASE_JITTER as JITTER, kubernetesTimingProblems } from '../config.ts'
import {
  type Env,
  endpointPeers,
  KubernetesApi,
  KubernetesApiError,
  type Lease,
  type LeaseSpec,
  microTime,
  podPeers,
  resolveConnection,
} from './kubernetes-api.ts'
import type { Coordinator, CoordinatorChange, CoordinatorOptions, Leadership, Peer } from './types.ts'

export type KubernetesCoordinatorOptions = CoordinatorOptions & {
  /** now: the clock every lease decision reads (tests inject one); default Date.now. */
  now?: () => number
  /** env: where K8S_API_URL, K8S_TOKEN and KUBERNETES_SERVICE_HOST/PORT are read; default process.env. */
  env?: Env
}

/**
 * KubernetesCoordinator: leadership borrowed from a `coordination.k8s.io/v1` Lease, acquired and
 * renewed as client-go's `tools/leaderelection` does (tryAcquireOrRenew: a holder's lease counts as
 * live until `leaseDurationSeconds` after this pod *observed* its last change, by this pod's clock;
 * every write carries the `resourceVersion` it read, so of two writers one gets 409 and loses the
 * round). The term is the Lease's `leaseTransitions`. `leadership().isLeader` is computed when read:
 * true only while the last successful renewal (timed from when it was sent) is younger than the
 * renew deadline, shorter than the lease, so this pod stops acting before any other may take over.
 *
 * Peers are re-listed every retry period rather than watched: one small GET per period needs no
 * long-lived stream, no resourceVersion bookkeeping or re-list on 410 Gone, and fails the same way
 * as the lease calls beside it.
 */
export class KubernetesCoordinator implements Coordinator {
  readonly kind = 'kubernetes'
  private readonly now: () => number
  private readonly renewDeadlineMs: number
  private readonly retryMs: number
  private readonly self: Peer
  private readonly listeners = new Set<(change: CoordinatorChange) => void>()
  private readonly stopCtl = new AbortController()
  private state: 'new' | 'starting' | 'running' | 'stopped' = 'new'
  private api: KubernetesApi | undefined
  private releaseApi: ((signal: AbortSignal) => KubernetesApi) | undefined
  /** lease: the object last read or written, whose resourceVersion the next write carries. */
  private lease: Lease | null = null
  private observed: LeaseSpec = {}
  private observedRaw = ''
  private observedTime = 0
  private lastRenew = Number.NEGATIVE_INFINITY
  private peerList: Peer[]
  private emitted: Leadership
  private timer: ReturnType<typeof setTimeout> | undefined
  private electing: Promise<void> | undefined
  private listing: Promise<void> | undefined
  private failing = { lease: false, peers: false }

  constructor(
    private readonly cfg: ClusterConfig['coordination']['kubernetes'],
    private readonly opts: KubernetesCoordinatorOptions,
  ) {
    this.now = opts.now ?? Date.now
    this.renewDeadlineMs = cfg.renew_deadline_seconds * 1000
    this.retryMs = cfg.retry_period_seconds * 1000
    // The cluster plugin's validate refuses these first; a coordinator built directly checks them too.
    const timing = kubernetesTimingProblems(cfg)
    if (timing.length > 0) throw new Error(timing.join('; '))
    this.self = { podId: opts.podId, address: opts.address }
    this.peerList = [this.self]
    this.emitted = this.leadership()
  }

  async start(): Promise<void> {
    if (this.state !== 'new') return
    this.state = 'starting'
    const conn = resolveConnection(this.cfg, this.opts.env ?? process.env)
    this.api = new KubernetesApi(conn, this.renewDeadlineMs, this.stopCtl.signal)
    this.releaseApi = (signal) => new KubernetesApi(conn, this.renewDeadlineMs, signal)
    // Both calls finish before start is judged, so a Lease written meanwhile is known and released.
    const first = Promise.allSettled([this.tryAcquireOrRenew(), this.refreshPeers()])
    this.electing = first.then(() => {})
    const failed = (await first).find((r) => r.status === 'rejected')
    if (failed) {
      this.electing = undefined
      await this.stop(AbortSignal.timeout(this.renewDeadlineMs))
      throw new Error(`kubernetes coordination could not start: ${(failed.reason as Error).message}`)
    }
    this.electing = undefined
    if (this.state !== 'starting') return
    this.state = 'running'
    this.opts.log.info('kubernetes coordination started', {
      lease: `${conn.namespace}/${this.cfg.lease_name}`,
      api: conn.baseUrl,
    })
    this.emitIfChanged()
    this.timer = setTimeout(this.tick, this.retryMs)
  }

  async stop(deadline: AbortSignal): Promise<void> {
    if (this.state === 'new' || this.state === 'stopped') {
      this.state = 'stopped'
      return
    }
    this.state = 'stopped'
    clearTimeout(this.timer)
    this.timer = undefined
    this.stopCtl.abort()
    await Promise.allSettled([this.electing, this.listing])
    if (this.releaseApi && this.observed.holderIdentity === this.opts.podId)
      await this.release(this.releaseApi(deadline)).catch((err) =>
        this.opts.log.warn('kubernetes lease not released; it expires by itself', { error: String(err) }),
      )
    this.emitIfChanged()
  }

  leadership(): Leadership {
    const holder = this.observed.holderIdentity || null
    return {
      leaderId: holder,
      leaderAddress:
        holder === null ? null : (this.peerList.find((p) => p.podId === holder)?.address ?? null),
      term: this.observed.leaseTransitions ?? 0,
      isLeader:
        this.state !== 'stopped' &&
        holder === this.opts.podId &&
        this.now() - this.lastRenew < this.renewDeadlineMs,
    }
  }

  peers(): Peer[] {
    return [...this.peerList]
  }

  subscribe(fn: (change: CoordinatorChange) => void): () => void {
    this.listeners.add(fn)
    return () => this.listeners.delete(fn)
  }

  /** tick: one retry period; a round still in flight (a hung API) is not doubled, only re-judged. */
  private readonly tick = (): void => {
    this.timer = undefined
    if (this.state !== 'running') return
    this.emitIfChanged()
    this.electing ??= this.guard('lease', () => this.tryAcquireOrRenew()).finally(() => {
      this.electing = undefined
    })
    this.listing ??= this.guard('peers', () => this.refreshPeers()).finally(() => {
      this.listing = undefined
    })
    const holding = this.observed.holderIdentity === this.opts.podId
    this.timer = setTimeout(this.tick, holding ? this.retryMs : this.retryMs * (1 + Math.random() * JITTER))
  }

  private async guard(what: 'lease' | 'peers', work: () => Promise<unknown>): Promise<void> {
    try {
      await work()
      if (this.failing[what]) this.opts.log.info(`kubernetes ${what} calls succeed again`)
      this.failing[what] = false
    } catch (err) {
      if (this.state !== 'running') return
      if (!this.failing[what]) this.opts.log.warn(`kubernetes ${what} call failed`, { error: String(err) })
      this.failing[what] = true
    } finally {
      this.emitIfChanged()
    }
  }

  /**
   * tryAcquireOrRenew is client-go's: the holder first renews on the object it last saw; otherwise
   * GET (404 → create with leaseTransitions 0), stay a follower while another holder's lease is live
   * by local observation, else PUT with the read resourceVersion (leaseTransitions + 1 when the
   * holder changes). A 409 means another pod wrote first: this round is lost. Other errors throw.
   */
  private async tryAcquireOrRenew(): Promise<boolean> {
    const api = this.api!
    const sent = this.now()
    const record: LeaseSpec = {
      holderIdentity: this.opts.podId,
      leaseDurationSeconds: this.cfg.lease_duration_seconds,
      acquireTime: microTime(sent),
      renewTime: microTime(sent),
    }
    const mine = () => this.observed.holderIdentity === this.opts.podId
    if (mine() && this.leaseLive(sent) && this.lease) {
      const spec = {
        ...record,
        acquireTime: this.observed.acquireTime,
        leaseTransitions: this.observed.leaseTransitions,
      }
      if (await this.write(() => api.updateLease({ ...this.lease!, spec }), sent).catch(() => false))
        return true
    }
    const current = await api.getLease(this.cfg.lease_name)
    if (current === null) {
      const lease: Lease = {
        apiVersion: 'coordination.k8s.io/v1',
        kind: 'Lease',
        metadata: { name: this.cfg.lease_name },
        spec: { ...record, leaseTransitions: 0 },
      }
      return this.write(() => api.createLease(lease), sent)
    }
    this.lease = current
    this.observe(current)
    if (this.observed.holderIdentity && this.leaseLive(sent) && !mine()) return false
    const transitions = current.spec.leaseTransitions ?? 0
    const spec = mine()
      ? { ...record, acquireTime: current.spec.acquireTime, leaseTransitions: transitions }
      : { ...record, leaseTransitions: transitions + 1 }
    return this.write(() => api.updateLease({ ...current, spec }), sent)
  }

  /** write: a create or update; true when it took, false on 409 (another pod wrote first). */
  private async write(call: () => Promise<Lease>, sent: number): Promise<boolean> {
    let written: Lease
    try {
      written = await call()
    } catch (err) {
      if (err instanceof KubernetesApiError && err.status === 409) {
        this.opts.log.debug('kubernetes lease written by another pod first', { reason: err.reason })
        return false
      }
      throw err
    }
    this.lease = written
    this.observe(written)
    if (written.spec.holderIdentity === this.opts.podId) this.lastRenew = sent
    return true
  }

  /**
   * observe: a changed Lease restarts the local expiry clock (client-go's observedTime). Changed is
   * judged on the record and its resourceVersion, so any write counts, even one with the same times.
   */
  private observe(lease: Lease): void {
    const raw = `${lease.metadata.resourceVersion} ${JSON.stringify(lease.spec)}`
    if (raw === this.observedRaw) return
    this.observed = lease.spec
    this.observedRaw = raw
    this.observedTime = this.now()
  }

  private leaseLive(now: number): boolean {
    return this.observedTime + (this.observed.leaseDurationSeconds ?? 0) * 1000 > now
  }

  /** release is client-go's ReleaseOnCancel: holder cleared, a 1 s lease, retried on conflict. */
  private async release(api: KubernetesApi): Promise<void> {
    for (let attempt = 0; attempt < 5; attempt++) {
      const current = await api.getLease(this.cfg.lease_name)
      if (current === null || current.spec.holderIdentity !== this.opts.podId) return
      const at = microTime(this.now())
      const spec: LeaseSpec = {
        holderIdentity: '',
        leaseDurationSeconds: 1,
        acquireTime: at,
        renewTime: at,
        leaseTransitions: current.spec.leaseTransitions ?? 0,
      }
      if (await this.write(() => api.updateLease({ ...current, spec }), this.now())) {
        this.opts.log.info('kubernetes lease released', { term: spec.leaseTransitions })
        return
      }
    }
  }

  private async refreshPeers(): Promise<void> {
    const d = this.cfg.discovery
    const found = d.service
      ? endpointPeers(await this.api!.getEndpoints(d.service), d.port)
      : podPeers(await this.api!.listPods(d.label_selector), d.port)
    const byId = new Map(found.map((p) => [p.podId, p]))
    byId.set(this.self.podId, this.self)
    const list = [...byId.values()].sort((a, b) => a.podId.localeCompare(b.podId))
    if (this.state === 'stopped' || JSON.stringify(list) === JSON.stringify(this.peerList)) return
    this.peerList = list
    this.emit({ type: 'peers', peers: this.peers() })
  }

  private emitIfChanged(): void {
    const now = this.leadership()
    const was = this.emitted
    if (
      now.leaderId === was.leaderId &&
      now.leaderAddress === was.leaderAddress &&
      now.term === was.term &&
      now.isLeader === was.isLeader
    )
      return
    this.emitted = now
    if (now.isLeader && !was.isLeader) this.opts.log.info('leading', { term: now.term })
    else if (was.isLeader && !now.isLeader)
      this.opts.log.warn('stopped leading', {
        term: was.term,
        why:
          this.state === 'stopped'
            ? 'stopping'
            : now.leaderId === this.opts.podId
              ? 'no successful renewal within the renew deadline'
              : 'lease lost',
      })
    else if (now.leaderId !== was.leaderId)
      this.opts.log.info('leader', { leaderId: now.leaderId, term: now.term })
    this.emit({ type: 'leadership', leadership: now })
  }

  private emit(change: CoordinatorChange): void {
    for (const fn of this.listeners) {
      try {
        fn(change)
      } catch (err) {
        this.opts.log.error('coordinator subscriber threw', { error: String(err) })
      }
    }
  }
}
