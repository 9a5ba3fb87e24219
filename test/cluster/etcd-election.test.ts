import { afterAll, afterEach, beforeAll, describe, expect, it } from 'bun:test'
import { createServer } from 'node:net'
import type { ClusterConfig } from '../../plugins/cluster/config.ts'
import { EtcdCoordinator } from '../../plugins/cluster/coordination/etcd.ts'
import type { CoordinatorChange, Leadership, Peer } from '../../plugins/cluster/coordination/types.ts'
import { Logger } from '../../src/host/logger.ts'
import { freePort } from '../sim/helpers.ts'
import {
  etcdAvailable,
  etcdctl,
  etcdKeys,
  startEtcd,
  startTcpProxy,
  type TcpProxy,
  type TestEtcd,
} from '../support/etcd.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The etcd coordinator against a real etcd (a single member on loopback), with a 2 s session TTL
 * so failovers are quick. Every coordinator's leadership is sampled throughout (every 20 ms and on
 * each change it reports): no two pods may ever report themselves leader under the same term.
 */
type EtcdConfig = ClusterConfig['coordination']['etcd']

const TTL = 2
const RENEW_DEADLINE_MS = Math.floor((TTL * 2000) / 3)
const PREFIX = '/modelgate-test'
const logs: string[] = []
const log = new Logger('debug', 'etcd-test', 'text', (line) => logs.push(line))

interface Pod {
  id: string
  address: string
  c: EtcdCoordinator
  events: CoordinatorChange[]
}

/** Group: the pods of one cluster (its own cluster id), with the sampler that checks fencing. */
class Group {
  readonly pods: Pod[] = []
  readonly violations: string[] = []
  private readonly holders = new Map<number, Set<string>>()
  private readonly timer = setInterval(() => this.sample(), 20)
  private static next = 0
  readonly clusterId = `c${++Group.next}-${process.pid}`

  add(id: string, endpoints: string[], extra: Partial<EtcdConfig> = {}, now?: () => number): Pod {
    const cfg: EtcdConfig = {
      endpoints,
      prefix: PREFIX,
      session_ttl_seconds: TTL,
      request_timeout_ms: 1000,
      ...extra,
    }
    const address = `http://10.0.0.${this.pods.length + 1}:3000`
    const c = new EtcdCoordinator(cfg, this.clusterId, { podId: id, address, log, ...(now ? { now } : {}) })
    const pod: Pod = { id, address, c, events: [] }
    c.subscribe((change) => {
      pod.events.push(change)
      this.sample()
    })
    this.pods.push(pod)
    return pod
  }

  sample(): void {
    for (const p of this.pods) {
      const l = p.c.leadership()
      if (!l.isLeader) continue
      const set = this.holders.get(l.term) ?? new Set<string>()
      set.add(p.id)
      this.holders.set(l.term, set)
      if (set.size > 1) this.violations.push(`term ${l.term} claimed by ${[...set].join(', ')}`)
    }
  }

  wake = (notify: () => void): (() => void) => {
    const offs = this.pods.map((p) => p.c.subscribe(notify))
    return () => {
      for (const off of offs) off()
    }
  }

  electionPrefix(): string {
    return `${PREFIX}/${this.clusterId}/election/`
  }

  /** stop stops every pod and checks the samples: that is where a fencing violation fails the test. */
  async stop(): Promise<void> {
    this.sample()
    clearInterval(this.timer)
    await Promise.all(this.pods.map((p) => p.c.stop(AbortSignal.timeout(5000))))
    expect(this.violations).toEqual([])
  }
}

const open: Group[] = []
function group(): Group {
  const g = new Group()
  open.push(g)
  return g
}

/** oneLeader waits until exactly one of `among` leads, with a term above `above`, and all of them agree on it. */
function oneLeader(g: Group, among: Pod[], above = 0): Promise<{ pod: Pod; l: Leadership }> {
  return waitFor(
    `one leader that ${among.map((p) => p.id).join(', ')} agree on, term > ${above}`,
    () => {
      const ls = among.map((p) => p.c.leadership())
      const i = ls.findIndex((l) => l.isLeader)
      const l = ls[i]
      if (!l || ls.filter((x) => x.isLeader).length !== 1 || l.term <= above) return undefined
      const agreed = ls.every(
        (x) => x.leaderId === l.leaderId && x.leaderAddress === l.leaderAddress && x.term === l.term,
      )
      return agreed && { pod: among[i]!, l }
    },
    { wake: g.wake, timeoutMs: 20_000, show: () => among.map((p) => ({ id: p.id, ...p.c.leadership() })) },
  )
}

const peersOf = (pods: Pod[]): Peer[] =>
  pods.map((p) => ({ podId: p.id, address: p.address })).sort((a, b) => a.podId.localeCompare(b.podId))

function samePeers(g: Group, on: Pod[], want: Pod[]): Promise<unknown> {
  const expected = JSON.stringify(peersOf(want))
  return waitFor(
    `peers ${want.map((p) => p.id).join(', ')} on ${on.map((p) => p.id).join(', ')}`,
    () => on.every((p) => JSON.stringify(p.c.peers()) === expected),
    { wake: g.wake, timeoutMs: 20_000, show: () => on.map((p) => ({ id: p.id, peers: p.c.peers() })) },
  )
}

async function startAll(g: Group, ids: string[], endpoints: (i: number) => string[], now?: () => number) {
  const pods = ids.map((id, i) => g.add(id, endpoints(i), {}, now))
  await Promise.all(pods.map((p) => p.c.start()))
  return pods
}

const available = etcdAvailable({ etcdctl: true })

describe.skipIf(!available)('etcd coordination', () => {
  let etcd: TestEtcd
  beforeAll(async () => {
    etcd = await startEtcd()
  })
  afterEach(async () => {
    for (const g of open.splice(0)) await g.stop()
  })
  afterAll(async () => {
    await etcd?.stop()
  })

  it('elects one leader that every pod agrees on, whose term is its election key, and lists every pod on each', async () => {
    const g = group()
    const pods = await startAll(g, ['a', 'b', 'c'], () => [etcd.url])
    const { pod, l } = await oneLeader(g, pods)
    expect(l).toEqual({ leaderId: pod.id, leaderAddress: pod.address, term: l.term, isLeader: true })
    const { keys } = await etcdKeys(etcd.url, g.electionPrefix())
    const lowest = keys.sort((x, y) => x.createRevision - y.createRevision)[0]!
    expect(JSON.parse(lowest.value)).toEqual({ podId: pod.id, address: pod.address })
    expect(l.term).toBe(lowest.createRevision)
    await samePeers(g, pods, pods)
  })

  it('hands leadership to another pod with a higher term when the leader stops', async () => {
    const g = group()
    const pods = await startAll(g, ['a', 'b', 'c'], () => [etcd.url])
    const first = await oneLeader(g, pods)
    await first.pod.c.stop(AbortSignal.timeout(5000))
    expect(first.pod.c.leadership().isLeader).toBe(false)
    const rest = pods.filter((p) => p !== first.pod)
    const next = await oneLeader(g, rest, first.l.term)
    expect(next.pod).not.toBe(first.pod)
    await samePeers(g, rest, rest)
  })

  it("removes a stopped pod from the others' peers", async () => {
    const g = group()
    const pods = await startAll(g, ['a', 'b', 'c'], () => [etcd.url])
    await samePeers(g, pods, pods)
    const gone = pods[1]!
    await gone.c.stop(AbortSignal.timeout(5000))
    await gone.c.stop(AbortSignal.timeout(5000))
    const rest = pods.filter((p) => p !== gone)
    await samePeers(g, rest, rest)
    const { keys } = await etcdKeys(etcd.url, `${PREFIX}/${g.clusterId}/`)
    expect(keys.map((k) => JSON.parse(k.value).podId)).not.toContain(gone.id)
  })

  it('makes a leader whose lease is revoked behind its back step down, and campaign again with a higher term', async () => {
    const g = group()
    const pods = await startAll(g, ['a', 'b', 'c'], () => [etcd.url])
    const first = await oneLeader(g, pods)
    const { keys } = await etcdKeys(etcd.url, g.electionPrefix())
    const oldKey = keys.find((k) => JSON.parse(k.value).podId === first.pod.id)!
    await etcdctl(etcd.url, 'lease', 'revoke', oldKey.key.slice(g.electionPrefix().length))

    const next = await oneLeader(g, pods, first.l.term)
    expect(next.pod).not.toBe(first.pod)
    expect(first.pod.c.leadership().isLeader).toBe(false)
    const newKey = await waitFor('the revoked pod to campaign again under a new lease', async () => {
      const { keys } = await etcdKeys(etcd.url, g.electionPrefix())
      return keys.find((k) => JSON.parse(k.value).podId === first.pod.id && k.key !== oldKey.key)
    })
    expect(newKey.createRevision).toBeGreaterThan(next.l.term)
    await samePeers(g, pods, pods)

    // With the other two gone it leads, under the term of its new key.
    await Promise.all(pods.filter((p) => p !== first.pod).map((p) => p.c.stop(AbortSignal.timeout(5000))))
    const last = await oneLeader(g, [first.pod], next.l.term)
    expect(last.l.term).toBe(newKey.createRevision)
  })

  it('stops counting itself leader the moment its clock passes the renew deadline without a keepalive', async () => {
    let t = 1_000_000
    const now = () => t
    const proxies: TcpProxy[] = await Promise.all([0, 1, 2].map(() => startTcpProxy(etcd.port)))
    try {
      const g = group()
      const pods = await startAll(g, ['a', 'b', 'c'], (i) => [proxies[i]!.url], now)
      const first = await oneLeader(g, pods)
      const mark = first.pod.events.length
      await proxies[pods.indexOf(first.pod)]!.cut()

      // Every keepalive it made was sent at t: it leads until t + deadline, and not a moment longer.
      t += RENEW_DEADLINE_MS - 1
      expect(first.pod.c.leadership().isLeader).toBe(true)
      t += 1
      expect(first.pod.c.leadership().isLeader).toBe(false)
      await waitFor(
        'the partitioned leader to tell its subscribers',
        () => first.pod.events.slice(mark).some((e) => e.type === 'leadership' && !e.leadership.isLeader),
        { wake: g.wake },
      )

      // Its lease expires in etcd: another pod leads; healed, it follows.
      const rest = pods.filter((p) => p !== first.pod)
      const next = await oneLeader(g, rest, first.l.term)
      await proxies[pods.indexOf(first.pod)]!.heal()
      const after = await oneLeader(g, pods, first.l.term)
      expect(after.l.term).toBeGreaterThanOrEqual(next.l.term)
      await samePeers(g, pods, pods)
    } finally {
      for (const g of open.splice(0)) await g.stop()
      await Promise.all(proxies.map((p) => p.close()))
    }
  })

  it('tells subscribers when a paused etcd makes the leader miss its renew deadline, and leads again after', async () => {
    const g = group()
    const pods = await startAll(g, ['a', 'b', 'c'], () => [etcd.url])
    const first = await oneLeader(g, pods)
    const mark = first.pod.events.length
    process.kill(etcd.pid, 'SIGSTOP')
    try {
      await waitFor(
        'the leader to report it no longer leads while etcd is paused',
        () => first.pod.events.slice(mark).some((e) => e.type === 'leadership' && !e.leadership.isLeader),
        { wake: g.wake },
      )
      expect(pods.filter((p) => p.c.leadership().isLeader)).toEqual([])
    } finally {
      process.kill(etcd.pid, 'SIGCONT')
    }
    await oneLeader(g, pods)
    await samePeers(g, pods, pods)
  })

  it('reads the pods again when the watch history it would resume from was compacted', async () => {
    const proxy = await startTcpProxy(etcd.port)
    try {
      const g = group()
      const pods = await startAll(g, ['a', 'b', 'c'], (i) => (i === 0 ? [proxy.url] : [etcd.url]))
      await samePeers(g, pods, pods)
      const [a, b, c] = pods as [Pod, Pod, Pod]
      await proxy.cut()
      const mark = logs.length
      await c.c.stop(AbortSignal.timeout(5000))
      const { revision } = await etcdKeys(etcd.url, PREFIX)
      await etcdctl(etcd.url, 'compaction', String(revision))
      await proxy.heal()
      await samePeers(g, [a, b], [a, b])
      // …through the re-read, not some other way: a's watch found its history compacted.
      expect(logs.slice(mark).some((line) => line.includes('compacted'))).toBe(true)
    } finally {
      for (const g of open.splice(0)) await g.stop()
      await proxy.close()
    }
  })

  it('tries the endpoints in order, past one that refuses connections', async () => {
    const g = group()
    const closed = `http://127.0.0.1:${await freePort()}`
    const [solo] = await startAll(g, ['solo'], () => [closed, etcd.url])
    // start resolves once the pod is registered: it lists itself at once.
    expect(solo!.c.peers()).toEqual(peersOf([solo!]))
    await oneLeader(g, [solo!])
  })

  it('refuses to start, naming the endpoints, when etcd refuses connections or does not answer', async () => {
    const g = group()
    const closed = `http://127.0.0.1:${await freePort()}`
    const refused = g.add('refused', [closed])
    await expect(refused.c.start()).rejects.toThrow(`cannot reach etcd at ${closed}`)

    const silent = createServer(() => {})
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve))
    try {
      const url = `http://127.0.0.1:${(silent.address() as { port: number }).port}`
      const mute = g.add('mute', [url], { request_timeout_ms: 300 })
      const err = await mute.c.start().catch((e: Error) => e)
      expect(String(err)).toContain(`etcd (${url}) unusable`)
      expect(String(err)).toContain('did not finish within 300 ms')
    } finally {
      silent.close()
    }
    const never = g.add('never', [etcd.url])
    await never.c.stop(AbortSignal.timeout(1000))
    await never.c.stop(AbortSignal.timeout(1000))
    await expect(never.c.start()).rejects.toThrow('starts only once')
  })

  it('authenticates with a username and password when etcd has auth enabled', async () => {
    const secured = await startEtcd()
    try {
      await etcdctl(secured.url, 'user', 'add', 'root:root-secret-1')
      await etcdctl(secured.url, 'user', 'grant-role', 'root', 'root')
      await etcdctl(secured.url, 'auth', 'enable')
      const g = group()
      const wrong = g.add('wrong', [secured.url], { username: 'root', password: 'nope' })
      await expect(wrong.c.start()).rejects.toThrow('authentication failed')
      const pods = ['a', 'b'].map((id) =>
        g.add(id, [secured.url], { username: 'root', password: 'root-secret-1' }),
      )
      await Promise.all(pods.map((p) => p.c.start()))
      await oneLeader(g, pods)
      await samePeers(g, pods, pods)
    } finally {
      for (const g of open.splice(0)) await g.stop()
      await secured.stop()
    }
  })
})
