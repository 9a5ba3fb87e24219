import type { Pod, PodState } from './schemas.ts'

/**
 * Membership: the pods this pod knows, what each last said about itself and when. A pod is healthy
 * while its last heartbeat (or event) is younger than `missed` heartbeat intervals; this pod is
 * always healthy to itself. Who leads is the coordinator's word, passed in when a view is built.
 */
interface Member {
  address: string
  state: PodState | null
  /** ms (clock) of the last heartbeat or event from it; null before the first. */
  heardAt: number | null
  heardIso: string | null
  /** listed by the coordination service (registered / discovered) */
  registered: boolean
}

export class Membership {
  private readonly members = new Map<string, Member>()

  constructor(
    private readonly selfId: string,
    private readonly silentAfterMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** heard records a pod's state; true when the pod was not known before (it joined). */
  heard(state: PodState): boolean {
    const m = this.members.get(state.podId)
    const at = this.now()
    const iso = new Date(at).toISOString()
    if (m) {
      m.state = state
      m.address = state.address
      m.heardAt = at
      m.heardIso = iso
      return false
    }
    this.members.set(state.podId, {
      address: state.address,
      state,
      heardAt: at,
      heardIso: iso,
      registered: false,
    })
    return true
  }

  /** registered sets which pods the coordination service lists; returns the ids that left it. */
  registered(peers: readonly { podId: string; address: string }[]): { joined: string[]; left: string[] } {
    const ids = new Set(peers.map((p) => p.podId))
    const joined: string[] = []
    const left: string[] = []
    for (const p of peers) {
      const m = this.members.get(p.podId)
      if (!m) {
        this.members.set(p.podId, {
          address: p.address,
          state: null,
          heardAt: null,
          heardIso: null,
          registered: true,
        })
        joined.push(p.podId)
      } else {
        if (!m.registered) joined.push(p.podId)
        m.registered = true
        if (!m.state) m.address = p.address
      }
    }
    for (const [id, m] of this.members) {
      if (id === this.selfId || ids.has(id) || !m.registered) continue
      m.registered = false
      left.push(id)
    }
    return { joined, left }
  }

  /** forget drops a pod that said it left (pod-left) or that the coordinator no longer lists and is silent. */
  forget(podId: string): void {
    if (podId !== this.selfId) this.members.delete(podId)
  }

  healthy(podId: string): boolean {
    if (podId === this.selfId) return true
    const m = this.members.get(podId)
    return !!m && m.heardAt !== null && this.now() - m.heardAt < this.silentAfterMs
  }

  /** peers: every other pod with its address (heartbeat targets). */
  peers(): { podId: string; address: string }[] {
    return [...this.members.entries()]
      .filter(([id]) => id !== this.selfId)
      .map(([podId, m]) => ({ podId, address: m.address }))
  }

  address(podId: string): string | undefined {
    return this.members.get(podId)?.address
  }

  state(podId: string): PodState | null {
    return this.members.get(podId)?.state ?? null
  }

  /** prune forgets pods neither registered nor heard from within the silence window. */
  prune(): string[] {
    const gone: string[] = []
    for (const [id, m] of this.members) {
      if (id === this.selfId || m.registered || this.healthy(id)) continue
      this.members.delete(id)
      gone.push(id)
    }
    return gone
  }

  /** states of the healthy pods (what a leader builds the routing table from). */
  healthyStates(self: PodState): PodState[] {
    const out = [self]
    for (const [id, m] of this.members)
      if (id !== this.selfId && m.state && this.healthy(id)) out.push(m.state)
    return out
  }

  view(self: PodState, leaderId: string | null): Pod[] {
    const ids = new Set([this.selfId, ...this.members.keys()])
    return [...ids].sort().map((id) => {
      const m = this.members.get(id)
      const state = id === this.selfId ? self : (m?.state ?? null)
      return {
        podId: id,
        address: state?.address ?? m?.address ?? '',
        role: id === leaderId ? 'leader' : 'follower',
        status: this.healthy(id) ? 'healthy' : 'unhealthy',
        lastHeartbeat: id === this.selfId ? new Date(this.now()).toISOString() : (m?.heardIso ?? null),
        joinedAt: state?.joinedAt ?? null,
        modelCount: state?.models.length ?? 0,
        gpus: state?.gpus ?? [],
        models: state?.models ?? [],
      }
    })
  }
}
