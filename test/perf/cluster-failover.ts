/**
 * bench:cluster, second half: failover time over leader kills. Three pods, each a `modelgate serve`
 * process of its own (test/support/pods.ts), led through a real etcd (Debian's etcd-server, one
 * member) with the shipped defaults (session TTL 10 s, heartbeats 5 s). Each round kills the leader
 * with -9 and measures, from the kill:
 *
 * - baseline: etcd itself deleting the dead pod's registration (its session lease expiring), seen
 *   by polling etcd every 50 ms; nothing can fail over before this, so it is the floor;
 * - elected: both survivors naming the same new leader with a higher term (GET /api/cluster);
 * - tables: both survivors holding the same routing table, built under the new term.
 *
 * The killed pod is then started again on its data dir and must rejoin (all three agree) before the
 * next round. Prints each round and min / median / max.
 *
 *   bun test/perf/cluster-failover.ts [--kills 5]
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { ClusterStatus, RoutingTable } from '../../plugins/cluster/schemas.ts'
import { freePort } from '../sim/helpers.ts'
import { etcdAvailable, etcdKeys, startEtcd } from '../support/etcd.ts'
import { PodProcess, type PodProcessOptions } from '../support/pods.ts'
import { waitFor } from '../support/wait.ts'
import { numberArg } from './args.ts'

const KILLS = Math.max(1, numberArg('--kills', 5) || 5)
const PREFIX = '/modelgate-bench-failover'
const CLUSTER_ID = 'bench-failover'

async function get<T>(pod: PodProcess, path: string): Promise<T | null> {
  try {
    const r = await fetch(`${pod.url}${path}`, { signal: AbortSignal.timeout(1000) })
    return r.status === 200 ? ((await r.json()) as T) : null
  } catch {
    return null
  }
}

/** agreed: every pod names the same leader and term, exactly one of them leading, and the same table. */
async function agreed(
  among: PodProcess[],
): Promise<{ leader: string; term: number; tables: boolean } | null> {
  const views = await Promise.all(among.map((p) => get<ClusterStatus>(p, '/api/cluster')))
  if (views.some((v) => !v)) return null
  const vs = views as ClusterStatus[]
  const first = vs[0]!
  if (!first.leaderId || vs.some((v) => v.leaderId !== first.leaderId || v.term !== first.term)) return null
  if (vs.filter((v) => v.isLeader).length !== 1) return null
  const tables = await Promise.all(among.map((p) => get<RoutingTable>(p, '/api/cluster/routing-table')))
  const key = (t: RoutingTable | null) => (t ? JSON.stringify([t.version, t.term, t.entries]) : 'none')
  const same = tables.every((t) => t && t.term === first.term && key(t) === key(tables[0]!))
  return { leader: first.leaderId, term: first.term, tables: same }
}

interface Round {
  baselineMs: number
  electedMs: number
  tablesMs: number
  from: string
  to: string
  terms: [number, number]
}

async function main(): Promise<void> {
  if (!etcdAvailable({ etcdctl: true })) return
  const etcd = await startEtcd()
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-bench-failover-'))
  const opts = new Map<string, PodProcessOptions>()
  const pods = new Map<string, PodProcess>()
  try {
    const ids = ['p1', 'p2', 'p3']
    const ports = await Promise.all(ids.map(() => freePort()))
    for (const [i, id] of ids.entries())
      opts.set(id, {
        dir,
        id,
        port: ports[i]!,
        enginePorts: [28500 + i * 10, 28509 + i * 10],
        gpus: '1x80',
        logLevel: 'warn',
        env: { CLUSTER_SECRET: 'bench-failover-cluster-secret-0123' },
        cluster: [
          `    cluster_id: ${CLUSTER_ID}`,
          `    pod_id: ${id}`,
          `    advertise_address: http://127.0.0.1:${ports[i]}`,
          `    expected_size: 3`,
          `    coordination:`,
          `      kind: etcd`,
          `      etcd: { endpoints: ['${etcd.url}'], prefix: ${PREFIX} }`,
        ].join('\n'),
      })
    await Promise.all(ids.map(async (id) => pods.set(id, await PodProcess.start(opts.get(id)!))))
    const rounds: Round[] = []
    for (let k = 0; k < KILLS; k++) {
      const before = await waitFor('all three pods to agree', () => agreed([...pods.values()]), {
        timeoutMs: 60_000,
        pollMs: 100,
      })
      const victim = pods.get(before.leader)!
      const survivors = [...pods.values()].filter((p) => p !== victim)
      const t0 = performance.now()
      await victim.kill()
      const registration = `${PREFIX}/${CLUSTER_ID}/pods/${victim.id}`
      const [baselineMs, elected] = await Promise.all([
        waitFor(
          `etcd to drop ${registration}`,
          async () => {
            const { keys } = await etcdKeys(etcd.url, registration)
            return keys.length === 0 ? performance.now() - t0 : undefined
          },
          { timeoutMs: 30_000, pollMs: 50 },
        ),
        waitFor(
          'a new leader both survivors agree on',
          async () => {
            const a = await agreed(survivors)
            return a && a.leader !== victim.id && a.term > before.term
              ? { ...a, at: performance.now() - t0 }
              : undefined
          },
          { timeoutMs: 30_000, pollMs: 25 },
        ),
      ])
      const tablesMs = await waitFor(
        "the survivors' tables identical under the new term",
        async () => ((await agreed(survivors))?.tables ? performance.now() - t0 : undefined),
        { timeoutMs: 30_000, pollMs: 25 },
      )
      const round = {
        baselineMs,
        electedMs: elected.at,
        tablesMs,
        from: victim.id,
        to: elected.leader,
        terms: [before.term, elected.term] as [number, number],
      }
      rounds.push(round)
      console.log(
        `kill ${k + 1}: ${round.from} → ${round.to} (term ${round.terms[0]} → ${round.terms[1]}): ` +
          `etcd lease gone ${fmt(baselineMs)}, new leader ${fmt(round.electedMs)}, tables ${fmt(tablesMs)}`,
      )
      pods.set(victim.id, await PodProcess.start(opts.get(victim.id)!))
    }
    report(rounds)
  } finally {
    await Promise.all([...pods.values()].map((p) => p.stop()))
    await etcd.stop()
    rmSync(dir, { recursive: true, force: true })
  }
}

const fmt = (ms: number) => `${(ms / 1000).toFixed(2)} s`

function stats(xs: number[]): string {
  const v = [...xs].sort((a, b) => a - b)
  const mid = v.length >> 1
  const median = v.length % 2 ? v[mid]! : (v[mid - 1]! + v[mid]!) / 2
  return `${fmt(v[0]!)} / ${fmt(median)} / ${fmt(v[v.length - 1]!)}`
}

function report(rounds: Round[]): void {
  console.log(`\nfailover over ${rounds.length} leader kills (kill -9), min / median / max:`)
  console.log(`  baseline: etcd drops the dead pod's lease   ${stats(rounds.map((r) => r.baselineMs))}`)
  console.log(`  new leader agreed by both survivors         ${stats(rounds.map((r) => r.electedMs))}`)
  console.log(`  routing tables identical under the new term ${stats(rounds.map((r) => r.tablesMs))}`)
  console.log(
    `  added by modelgate (new leader − baseline)  ${stats(rounds.map((r) => r.electedMs - r.baselineMs))}`,
  )
}

await main()
