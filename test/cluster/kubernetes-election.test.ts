import { afterEach, beforeEach, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { ClusterConfig } from '../../plugins/cluster/config.ts'
import { KubernetesCoordinator } from '../../plugins/cluster/coordination/kubernetes.ts'
import type { CoordinatorChange, Leadership } from '../../plugins/cluster/coordination/types.ts'
import { Logger } from '../../src/host/logger.ts'
import { LeaseStandIn } from '../support/lease-stand-in.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The `kubernetes` coordination backend against LeaseStandIn, a STAND-IN for the Kubernetes API
 * server (Lease GET/POST/PUT with resourceVersion conflicts, pods, Endpoints, bearer tokens): not a
 * real cluster. Time is an injected clock: lease expiry and the renew deadline are judged on it, so
 * no test sleeps for them; the retry period (20 ms) is real.
 */
type KubeConfig = ClusterConfig['coordination']['kubernetes']

let standIn: LeaseStandIn
let clock: { t: number }
let dir: string
let tokenFile: string
let running: KubernetesCoordinator[]
let logs: string[]

beforeEach(() => {
  standIn = new LeaseStandIn('token-1')
  clock = { t: Date.UTC(2026, 0, 1) }
  dir = mkdtempSync(join(tmpdir(), 'k8s-election-'))
  tokenFile = join(dir, 'token')
  writeFileSync(tokenFile, 'token-1\n')
  running = []
  logs = []
})

afterEach(async () => {
  await Promise.all(running.map((c) => c.stop(AbortSignal.timeout(5000))))
  await standIn.stop()
  rmSync(dir, { recursive: true, force: true })
})

function coordinator(podId: string, over: Partial<KubeConfig> = {}): KubernetesCoordinator {
  const cfg: KubeConfig = {
    api_url: standIn.url,
    namespace: 'default',
    token_file: tokenFile,
    ca_file: join(dir, 'no-ca.crt'),
    lease_name: 'modelgate-leader',
    lease_duration_seconds: 15,
    renew_deadline_seconds: 10,
    retry_period_seconds: 0.02,
    discovery: { label_selector: 'app.kubernetes.io/name=modelgate', port: 3000 },
    ...over,
  }
  const log = new Logger('debug', podId, 'text', (line) => logs.push(line))
  const c = new KubernetesCoordinator(cfg, {
    podId,
    address: `http://127.0.0.1:${4000 + running.length}`,
    log,
    now: () => clock.t,
    env: {},
  })
  running.push(c)
  return c
}

/** termGuard samples every coordinator on each change (and every 5 ms): which pods led in which term. */
function termGuard(cs: KubernetesCoordinator[], ids: string[]) {
  const leaders = new Map<number, Set<string>>()
  const sample = () => {
    cs.forEach((c, i) => {
      const l = c.leadership()
      if (!l.isLeader) return
      leaders.set(l.term, (leaders.get(l.term) ?? new Set()).add(ids[i]!))
    })
  }
  const unsubscribe = cs.map((c) => c.subscribe(sample))
  const timer = setInterval(sample, 5)
  return {
    leaders,
    stop() {
      sample()
      clearInterval(timer)
      for (const u of unsubscribe) u()
    },
  }
}

function expectOneLeaderPerTerm(leaders: Map<number, Set<string>>): void {
  expect(leaders.size).toBeGreaterThan(0)
  for (const [term, pods] of leaders)
    expect({ term, pods: [...pods] }).toEqual({ term, pods: [[...pods][0]!] })
}

/** agreed: the leadership every coordinator reports, once they all name the same leader and term. */
function agreed(cs: KubernetesCoordinator[]): Leadership[] | false {
  const ls = cs.map((c) => c.leadership())
  const first = ls[0]!
  const same = ls.every((l) => l.leaderId === first.leaderId && l.term === first.term)
  return same && first.leaderId !== null && ls.filter((l) => l.isLeader).length === 1 && ls
}

const leaseCalls = (verb: string) =>
  standIn.calls.filter((c) => c.resource === 'leases' && c.verb === verb).length

describe('kubernetes coordination against a stand-in Lease API (not a real API server)', () => {
  it('three pods elect exactly one leader; all agree on the leader and the term (leaseTransitions)', async () => {
    const ids = ['pod-a', 'pod-b', 'pod-c']
    const cs = ids.map((id) => coordinator(id))
    const guard = termGuard(cs, ids)
    await Promise.all(cs.map((c) => c.start()))
    const ls = await waitFor('one leader all three agree on', () => agreed(cs))
    guard.stop()
    const leader = ls[0]!.leaderId!
    expect(ids).toContain(leader)
    expect(ls.map((l) => l.term)).toEqual([0, 0, 0])
    const lease = standIn.lease('modelgate-leader')!
    expect(lease.spec.holderIdentity).toBe(leader)
    expect(lease.spec.leaseTransitions).toBe(0)
    expect(lease.spec.leaseDurationSeconds).toBe(15)
    expect(lease.spec.renewTime).toBe('2026-01-01T00:00:00.000000Z')
    expect(leaseCalls('create')).toBeGreaterThanOrEqual(1)
    expectOneLeaderPerTerm(guard.leaders)
  })

  it('a leader that stops releases the lease, and another pod acquires it with leaseTransitions + 1', async () => {
    const ids = ['pod-a', 'pod-b', 'pod-c']
    const cs = ids.map((id) => coordinator(id))
    const guard = termGuard(cs, ids)
    await Promise.all(cs.map((c) => c.start()))
    const first = (await waitFor('a first leader', () => agreed(cs)))[0]!
    const old = cs[ids.indexOf(first.leaderId!)]!
    await old.stop(AbortSignal.timeout(5000))
    expect(old.leadership().isLeader).toBe(false)
    const rest = cs.filter((c) => c !== old)
    const next = (await waitFor('a new leader among the others', () => agreed(rest)))[0]!
    guard.stop()
    expect(next.leaderId).not.toBe(first.leaderId)
    expect(next.term).toBe(first.term + 1)
    expect(standIn.lease('modelgate-leader')!.spec).toMatchObject({
      holderIdentity: next.leaderId,
      leaseTransitions: first.term + 1,
    })
    expect(guard.leaders.get(first.term)).toEqual(new Set([first.leaderId!]))
    expect(guard.leaders.get(next.term)).toEqual(new Set([next.leaderId!]))
    expectOneLeaderPerTerm(guard.leaders)
  })

  it("waits out another holder's lease by its own clock, then of two racing candidates exactly one wins (the other gets 409)", async () => {
    // renewTime is years old: only the local observation time counts (client-go's observedTime).
    const at = '2020-01-01T00:00:00.000000Z'
    standIn.seedLease('modelgate-leader', {
      holderIdentity: 'ghost',
      leaseDurationSeconds: 15,
      acquireTime: at,
      renewTime: at,
      leaseTransitions: 4,
    })
    const ids = ['pod-a', 'pod-b']
    const cs = ids.map((id) => coordinator(id))
    const guard = termGuard(cs, ids)
    await Promise.all(cs.map((c) => c.start()))
    const gets = leaseCalls('get')
    clock.t += 14_999
    await waitFor('ten more lease reads', () => leaseCalls('get') >= gets + 10)
    expect(cs.map((c) => c.leadership())).toEqual(
      cs.map(() => ({ leaderId: 'ghost', leaderAddress: null, term: 4, isLeader: false })),
    )
    expect(leaseCalls('update')).toBe(0)

    standIn.holdWrites(2)
    clock.t += 2
    const ls = await waitFor('one of the two candidates leading', () => agreed(cs))
    guard.stop()
    expect(standIn.conflicts).toBe(1)
    expect(ls.map((l) => l.term)).toEqual([5, 5])
    expect(standIn.lease('modelgate-leader')!.spec).toMatchObject({
      holderIdentity: ls[0]!.leaderId,
      leaseTransitions: 5,
    })
    expectOneLeaderPerTerm(guard.leaders)
  })

  for (const mode of ['refuse', 'hang'] as const) {
    it(`a leader whose API server ${mode === 'refuse' ? 'refuses' : 'hangs'} stops leading the moment the clock passes the renew deadline`, async () => {
      const c = coordinator('pod-a')
      const changes: CoordinatorChange[] = []
      c.subscribe((ch) => changes.push(ch))
      await c.start()
      await waitFor('pod-a leading', () => c.leadership().isLeader)
      standIn.setMode(mode)
      clock.t += 9_999
      expect(c.leadership().isLeader).toBe(true)
      clock.t += 1
      expect(c.leadership()).toEqual({
        leaderId: 'pod-a',
        leaderAddress: 'http://127.0.0.1:4000',
        term: 0,
        isLeader: false,
      })
      await waitFor('a leadership change saying pod-a no longer leads', () =>
        changes.some(
          (ch) => ch.type === 'leadership' && ch.leadership.leaderId === 'pod-a' && !ch.leadership.isLeader,
        ),
      )
      expect(logs.some((l) => l.includes('stopped leading') && l.includes('renew deadline'))).toBe(true)

      standIn.setMode('serve')
      await waitFor('pod-a leading again once it renews', () => c.leadership().isLeader)
      expect(c.leadership().term).toBe(0)
    })
  }

  it('refuses to start with a token the API server rejects, saying so', async () => {
    writeFileSync(tokenFile, 'stale-token\n')
    const c = coordinator('pod-a')
    await expect(c.start()).rejects.toThrow(
      /could not start: get lease: Kubernetes API answered 401 Unauthorized.*token was refused/,
    )
    expect(standIn.lease('modelgate-leader')).toBeUndefined()
    await c.stop(AbortSignal.timeout(1000))
    await c.stop(AbortSignal.timeout(1000))
  })

  it('is safe to stop before start and twice', async () => {
    const c = coordinator('pod-a')
    await c.stop(AbortSignal.timeout(1000))
    await c.stop(AbortSignal.timeout(1000))
    expect(c.leadership().isLeader).toBe(false)
    expect(c.peers()).toEqual([{ podId: 'pod-a', address: 'http://127.0.0.1:4000' }])
  })
})
