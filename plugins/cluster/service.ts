import type { EventBus } from '../../src/host/bus.ts'
import type { Logger } from '../../src/host/logger.ts'
import type { GatewayApi, InstanceRecord } from '../gateway/api.ts'
import type { ClusterConfig } from './config.ts'
import type { Coordinator, CoordinatorChange, Leadership } from './coordination/types.ts'
import { Membership } from './membership.ts'
import { type PeerCalls, PeerError } from './peer-client.ts'
import type { ClusterStateRepo } from './repo.ts'
import { buildEntries, EMPTY_TABLE, newer, sameEntries } from './routing-table.ts'
import type {
  ClusterEvent,
  ClusterEventType,
  ClusterStatus,
  Heartbeat,
  InternalState,
  Pod,
  PodGpu,
  PodModel,
  PodState,
  RoutingTable,
} from './schemas.ts'
import { TermFence } from './term.ts'

export interface ClusterDeps {
  cfg: ClusterConfig
  podId: string
  /** address: this pod's base URL for its peers (known once the listener is open). */
  address: () => string
  /** coordinator is made at start, once the address is known. */
  coordinator: (address: string) => Coordinator
  /** How the service reaches another pod's signed /internal API (PeerClient). */
  peers: Pick<PeerCalls, 'request'>
  gateway: GatewayApi
  bus: EventBus
  log: Logger
  repo: ClusterStateRepo
  now?: () => number
  /** changed: what this pod knows of the cluster may have changed (the dashboard's feed). */
  changed?: () => void
}

declare module '../../src/host/bus.ts' {
  interface BusEvents {
    /** cluster.routing: this pod adopted a routing table (from its leader, or built it as leader). */
    'cluster.routing': RoutingTable
    /** cluster.pod.joined: another pod announced it (re)joined (its pod-joined event), at `address`. */
    'cluster.pod.joined': { podId: string; address: string }
  }
}

/**
 * ClusterService: this pod's part in the cluster. It tells its peers what it holds (heartbeats every
 * interval, an event at once on every change), keeps what they said (Membership), and follows the
 * leader the coordination service names. As leader it builds the routing table from the healthy
 * pods' states and sends it with its heartbeats; as follower it adopts a leader's table when it is
 * newer and not from a deposed term (TermFence). A leader acts only while `isLeader` holds at the
 * moment it acts, so a paused leader that wakes up sends nothing under its old term.
 */
export class ClusterService {
  readonly fence: TermFence
  readonly members: Membership
  private table: RoutingTable
  private readonly joinedAt = new Date().toISOString()
  private gpus: PodGpu[] = []
  private timer: Timer | null = null
  private readonly unsubscribe: (() => void)[] = []
  private readonly pending = new Set<Promise<unknown>>()
  private started = false
  private stopping = false
  private wasLeader = false
  private readonly now: () => number
  private coord: Coordinator | null = null
  private address = ''
  /** Instances this pod reports as `standby` (out of the routing table): see standby(). */
  private readonly standbyIds = new Set<string>()

  constructor(private readonly deps: ClusterDeps) {
    this.now = deps.now ?? Date.now
    this.fence = new TermFence(deps.repo)
    const cfg = deps.cfg
    this.members = new Membership(
      deps.podId,
      cfg.heartbeat_interval_ms * cfg.unhealthy_after_missed,
      this.now,
    )
    this.table = deps.repo.get<RoutingTable>('routing_table') ?? EMPTY_TABLE
  }

  get podId(): string {
    return this.deps.podId
  }

  routingTable(): RoutingTable {
    return this.table
  }

  /** coordinator: the coordination backend (made at start). */
  get coordinator(): Coordinator {
    if (!this.coord) throw new Error('cluster not started')
    return this.coord
  }

  /** lead: who leads as the coordination service says (nobody before start). */
  lead(): Leadership {
    return this.coord?.leadership() ?? { leaderId: null, leaderAddress: null, term: 0, isLeader: false }
  }

  async start(): Promise<void> {
    const { bus } = this.deps
    this.address = this.deps.address()
    const coordinator = this.deps.coordinator(this.address)
    this.coord = coordinator
    this.started = true
    await coordinator.start()
    // What the coordination service says before anything is sent: peers refuse a lower term.
    this.fence.observe(coordinator.leadership().term)
    this.unsubscribe.push(coordinator.subscribe((c) => this.onCoordinator(c)))
    this.unsubscribe.push(
      bus.on('gateway.instance.status', (e) => this.onInstance(e.instance, e.currentStatus)),
      bus.on('gateway.move.progress', (e) => {
        if (e.phase === 'completed') this.broadcast('model-moved')
      }),
    )
    this.members.registered(coordinator.peers())
    await this.refreshGpus()
    await this.resync()
    this.broadcast('pod-joined')
    this.onLeadership()
    this.timer = setInterval(() => this.tick(), this.deps.cfg.heartbeat_interval_ms)
  }

  async stop(deadline: AbortSignal): Promise<void> {
    this.stopping = true
    if (this.timer) clearInterval(this.timer)
    this.timer = null
    for (const u of this.unsubscribe.splice(0)) u()
    if (this.started) {
      this.broadcast('pod-left')
      await Promise.race([
        Promise.allSettled([...this.pending]),
        new Promise((r) => deadline.addEventListener('abort', r, { once: true })),
      ])
    }
    await this.coord?.stop(deadline)
  }

  /** localState: what this pod says about itself. */
  localState(): PodState {
    return {
      podId: this.deps.podId,
      address: this.address,
      joinedAt: this.joinedAt,
      term: this.fence.term,
      routingTableVersion: this.table.version,
      models: this.deps.gateway
        .list()
        .filter(holdsGpu)
        .map((i) => podModel(this.deps.podId, i, this.standbyIds.has(i.id))),
      gpus: this.gpus,
    }
  }

  /**
   * standby takes an instance out of the routing table (`standby` in this pod's state, which the
   * leader's table skips) or puts it back, and announces it at once (model-moved): the leader rebuilds
   * and sends its table. A move across pods switches traffic with it while both instances run: the
   * target is put in, then the source taken out, each once every pod routes by the previous table.
   */
  standby(instanceId: string, on: boolean): void {
    if (on === this.standbyIds.has(instanceId)) return
    if (on) this.standbyIds.add(instanceId)
    else this.standbyIds.delete(instanceId)
    this.rebuild()
    const name = this.deps.gateway.get(instanceId)?.served_model_name
    this.broadcast('model-moved', { instanceId, ...(name === undefined ? {} : { modelName: name }) })
  }

  /** peerAddress: a pod's base URL (this pod's own included), or undefined for an unknown pod. */
  peerAddress(podId: string): string | undefined {
    return podId === this.deps.podId ? this.address : this.members.address(podId)
  }

  /**
   * ownerOf: the pod that holds an instance: this one when the gateway has it, else the pod whose last
   * reported state lists it; null when no pod does.
   */
  ownerOf(instanceId: string): { podId: string; address: string; local: boolean } | null {
    if (this.deps.gateway.get(instanceId))
      return { podId: this.deps.podId, address: this.address, local: true }
    for (const pod of this.pods()) {
      if (pod.podId === this.deps.podId) continue
      if (pod.models.some((m) => m.instanceId === instanceId))
        return { podId: pod.podId, address: pod.address, local: false }
    }
    return null
  }

  pods(): Pod[] {
    return this.members.view(this.localState(), this.lead().leaderId)
  }

  status(): ClusterStatus {
    const lead = this.lead()
    const term = Math.max(lead.term, this.fence.term)
    const pods = this.pods()
    const healthy = pods.filter((p) => p.status === 'healthy').length
    const everyone = healthy === pods.length && pods.length >= this.deps.cfg.expected_size
    const leaderHeard = lead.leaderId !== null && this.members.healthy(lead.leaderId)
    return {
      clusterId: this.deps.cfg.cluster_id,
      isClusterMode: true,
      localPodId: this.deps.podId,
      podCount: pods.length,
      healthyPodCount: healthy,
      leaderId: lead.leaderId,
      leaderAddress: lead.leaderAddress,
      term,
      isLeader: lead.isLeader,
      coordination: this.deps.cfg.coordination.kind,
      expectedSize: this.deps.cfg.expected_size,
      totalModelsLoaded: pods.reduce((n, p) => n + p.modelCount, 0),
      totalGpus: pods.reduce((n, p) => n + p.gpus.length, 0),
      routingTableVersion: this.table.version,
      health: healthy === 0 ? 'critical' : everyone && leaderHeard ? 'healthy' : 'degraded',
    }
  }

  internalState(): InternalState {
    const lead = this.lead()
    return {
      state: this.localState(),
      leaderId: lead.leaderId,
      term: this.fence.term,
      routingTable: this.table,
      pods: this.pods(),
    }
  }

  /** onHeartbeat: a peer's heartbeat (its term already admitted by the internal routes). */
  onHeartbeat(hb: Heartbeat): { podId: string; term: number; routingTableVersion: number } {
    this.hear(hb.state)
    if (hb.routingTable) this.adopt(hb.routingTable)
    return { podId: this.deps.podId, term: this.fence.term, routingTableVersion: this.table.version }
  }

  /** onEvent: a peer's cluster event (its term already admitted). */
  onEvent(ev: ClusterEvent): void {
    this.deps.log.info('cluster event', {
      type: ev.type,
      pod: ev.podId,
      instance: ev.instanceId,
      term: ev.term,
    })
    if (ev.type === 'pod-left') {
      this.members.forget(ev.podId)
      this.deps.changed?.()
      this.rebuild()
      return
    }
    if (ev.state) this.hear(ev.state)
    if (ev.term !== undefined) this.fence.observe(ev.term)
    if (ev.routingTable) this.adopt(ev.routingTable)
    const address = this.members.address(ev.podId)
    if (ev.type === 'pod-joined' && ev.podId !== this.deps.podId && address)
      this.deps.bus.emit('cluster.pod.joined', { podId: ev.podId, address })
  }

  private hear(state: PodState): void {
    this.deps.changed?.()
    const joined = this.members.heard(state)
    if (joined) this.deps.log.info('pod joined', { pod: state.podId, address: state.address })
    this.fence.observe(state.term)
    this.rebuild()
  }

  /** adopt takes a leader's table when it is newer and from a term no lower than the highest seen. */
  private adopt(table: RoutingTable): void {
    if (table.term < this.fence.term || !newer(table, this.table)) return
    this.fence.observe(table.term)
    this.setTable(table)
  }

  private setTable(table: RoutingTable): void {
    this.table = table
    this.deps.repo.set('routing_table', table)
    this.deps.bus.emit('cluster.routing', table)
    this.deps.changed?.()
  }

  /**
   * rebuild: as leader (now, by the clock), build the table from the healthy pods' states; a changed
   * table (or a new term) gets the next version and is sent to every peer at once.
   */
  private rebuild(): void {
    const lead = this.lead()
    if (!lead.isLeader || this.stopping) return
    this.fence.observe(lead.term)
    const entries = buildEntries(this.members.healthyStates(this.localState()))
    if (this.table.term === lead.term && sameEntries(entries, this.table.entries)) return
    this.setTable({
      version: this.table.version + 1,
      term: lead.term,
      builtBy: this.deps.podId,
      entries,
    })
    this.heartbeatAll()
  }

  private onCoordinator(change: CoordinatorChange): void {
    this.deps.changed?.()
    if (change.type === 'peers') {
      const { joined, left } = this.members.registered(change.peers)
      for (const id of joined) this.deps.log.info('pod registered', { pod: id })
      for (const id of left) this.deps.log.warn('pod left the coordination service', { pod: id })
      for (const id of left) if (!this.members.healthy(id)) this.members.forget(id)
      if (left.length > 0 || joined.length > 0) this.rebuild()
      return
    }
    this.onLeadership()
  }

  private onLeadership(): void {
    const lead = this.lead()
    this.fence.observe(lead.term)
    if (lead.isLeader && !this.wasLeader) {
      this.deps.log.info('leading the cluster', { term: lead.term })
      this.rebuild()
      this.broadcast('leader-elected', { term: lead.term, routingTable: this.table })
    } else if (!lead.isLeader && this.wasLeader) {
      this.deps.log.warn('no longer leading the cluster', { term: lead.term, leader: lead.leaderId })
    }
    this.wasLeader = lead.isLeader
  }

  private onInstance(instance: InstanceRecord, status: string): void {
    const type: ClusterEventType | null =
      status === 'active' || status === 'sleeping'
        ? 'model-loaded'
        : status === 'removed' || status === 'failed' || status === 'stopping'
          ? 'model-unloaded'
          : null
    if (!type) return
    this.deps.changed?.()
    if (status === 'removed') this.standbyIds.delete(instance.id)
    this.rebuild()
    this.broadcast(type, { instanceId: instance.id, modelName: instance.served_model_name })
  }

  /** broadcast sends a cluster event, with this pod's state, to every peer at once. */
  broadcast(type: ClusterEventType, extra: Partial<ClusterEvent> = {}): void {
    const body: ClusterEvent = {
      type,
      podId: this.deps.podId,
      at: new Date(this.now()).toISOString(),
      state: this.localState(),
      ...extra,
    }
    if (type === 'leader-elected' && !this.lead().isLeader) return
    this.sendAll('/internal/cluster/event', body)
  }

  private tick(): void {
    // A pod silent past its deadline turns unhealthy with nothing heard: the beat shows it.
    this.deps.changed?.()
    void this.refreshGpus()
    for (const id of this.members.prune())
      this.deps.log.warn('pod forgotten (silent, unregistered)', { pod: id })
    const lead = this.lead()
    if (lead.isLeader !== this.wasLeader) this.onLeadership()
    this.rebuild()
    this.heartbeatAll()
  }

  /** heartbeatAll sends this pod's state (and, while leading, the routing table) to every peer. */
  private heartbeatAll(): void {
    const body: Heartbeat = { state: this.localState() }
    if (this.lead().isLeader) body.routingTable = this.table
    this.sendAll('/internal/heartbeat', body)
  }

  private sendAll(path: string, body: unknown): void {
    for (const peer of this.members.peers()) {
      const p = this.deps.peers
        .request(peer, 'POST', path, body, { timeoutMs: this.deps.cfg.request_timeout_ms })
        .catch((err: unknown) => this.onSendError(peer.podId, path, err))
        .finally(() => this.pending.delete(p))
      this.pending.add(p)
    }
  }

  private onSendError(podId: string, path: string, err: unknown): void {
    if (err instanceof PeerError && err.code === 'STALE_TERM') {
      this.deps.log.warn('a peer refused our term: catching up', { pod: podId, term: err.peerTerm })
      if (err.peerTerm !== null) this.fence.observe(err.peerTerm)
      return
    }
    this.deps.log.debug('cluster call failed', {
      pod: podId,
      path,
      error: err instanceof Error ? err.message : String(err),
    })
  }

  /** resync asks a peer (the leader first) for its state: a rejoining pod gets the table at once. */
  private async resync(): Promise<void> {
    const lead = this.lead()
    const peers = this.members.peers()
    const first = peers.find((p) => p.podId === lead.leaderId)
    const order = first ? [first, ...peers.filter((p) => p !== first)] : peers
    for (const peer of order) {
      try {
        const s = await this.deps.peers.request<InternalState>(peer, 'GET', '/internal/state', undefined, {
          timeoutMs: this.deps.cfg.request_timeout_ms,
        })
        this.fence.observe(s.term)
        this.members.heard(s.state)
        this.adopt(s.routingTable)
        return
      } catch (err) {
        this.onSendError(peer.podId, '/internal/state', err)
      }
    }
  }

  private async refreshGpus(): Promise<void> {
    try {
      const snap = await this.deps.gateway.gpuReading()
      if (!snap.available) return
      this.gpus = snap.gpus.map((g) => ({
        gpuId: g.index,
        name: g.name,
        totalVramMB: g.memoryTotalMib ?? 0,
        usedVramMB: g.memoryUsedMib ?? 0,
        temperature: g.temperatureC ?? 0,
        utilization: g.utilizationPercent ?? 0,
      }))
    } catch (err) {
      this.deps.log.debug('GPU snapshot failed', { error: String(err) })
    }
  }
}

/** holdsGpu: instances a pod reports (everything but a failed one). */
function holdsGpu(i: InstanceRecord): boolean {
  return i.status !== 'failed'
}

/** podModel: an instance as its pod reports it; `standby`: serving here, but out of the routing table. */
export function podModel(podId: string, i: InstanceRecord, standby = false): PodModel {
  const serving = i.status === 'active' || i.status === 'sleeping'
  return {
    instanceId: i.id,
    podId,
    modelPath: i.model_path,
    modelName: i.served_model_name,
    status: standby && serving ? 'standby' : i.status === 'active' ? 'running' : i.status,
    port: i.port,
    gpuIds: i.gpu_ids,
    tensorParallelSize: i.tensor_parallel_size,
  }
}
