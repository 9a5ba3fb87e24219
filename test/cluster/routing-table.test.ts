import { Database } from 'bun:sqlite'
import { describe, expect, it } from 'bun:test'
import { drizzle } from 'drizzle-orm/bun-sqlite'
import stateSql from '../../plugins/cluster/db/migrations/0001_cluster_state.sql' with { type: 'text' }
import { Membership } from '../../plugins/cluster/membership.ts'
import { ClusterStateRepo } from '../../plugins/cluster/repo.ts'
import { buildEntries, EMPTY_TABLE, hopCandidates, newer } from '../../plugins/cluster/routing-table.ts'
import type { PodModel, PodState } from '../../plugins/cluster/schemas.ts'
import { TermFence } from '../../plugins/cluster/term.ts'
import { AppError } from '../../src/http/errors.ts'

function model(podId: string, instanceId: string, name: string, status = 'running', port = 8100): PodModel {
  return {
    instanceId,
    podId,
    modelPath: `org/${name}`,
    modelName: name,
    status,
    port,
    gpuIds: [0],
    tensorParallelSize: 1,
  }
}

function pod(podId: string, models: PodModel[]): PodState {
  return {
    podId,
    address: `http://${podId}:3000`,
    joinedAt: '2026-11-23T00:00:00.000Z',
    term: 1,
    routingTableVersion: 0,
    models,
    gpus: [],
  }
}

function repo(): ClusterStateRepo {
  const sqlite = new Database(':memory:')
  sqlite.exec(stateSql)
  return new ClusterStateRepo(drizzle(sqlite))
}

describe('routing table', () => {
  it('maps each served name to its pods, running before sleeping, failed and starting left out', () => {
    const entries = buildEntries([
      pod('b', [model('b', 'i2', 'qwen', 'sleeping', 8102), model('b', 'i3', 'llama', 'starting')]),
      pod('a', [model('a', 'i1', 'qwen', 'running', 8101), model('a', 'i4', 'mistral', 'failed')]),
    ])
    expect(Object.keys(entries).sort()).toEqual(['qwen'])
    expect(entries.qwen).toEqual([
      { podId: 'a', podAddress: 'http://a:3000', vllmPort: 8101, weight: 1 },
      { podId: 'b', podAddress: 'http://b:3000', vllmPort: 8102, weight: 0 },
    ])
  })

  it('is the same whatever order the states arrive in (two leaders build the same table)', () => {
    const a = pod('a', [model('a', 'x', 'm', 'running', 1), model('a', 'y', 'm', 'running', 2)])
    const b = pod('b', [model('b', 'z', 'm', 'running', 3)])
    expect(JSON.stringify(buildEntries([a, b]))).toBe(JSON.stringify(buildEntries([b, a])))
  })

  it('prefers a higher term, then a higher version, and never a lower term', () => {
    const t = (term: number, version: number) => ({ ...EMPTY_TABLE, term, version })
    expect(newer(t(2, 1), t(1, 9))).toBe(true)
    expect(newer(t(1, 9), t(2, 1))).toBe(false)
    expect(newer(t(2, 3), t(2, 2))).toBe(true)
    expect(newer(t(2, 2), t(2, 2))).toBe(false)
  })

  it('never offers this pod itself as a hop', () => {
    const table = {
      ...EMPTY_TABLE,
      entries: buildEntries([pod('a', [model('a', 'i', 'm')]), pod('b', [model('b', 'j', 'm')])]),
    }
    expect(hopCandidates(table, 'm', 'a').map((e) => e.podId)).toEqual(['b'])
    expect(hopCandidates(table, 'nowhere', 'a')).toEqual([])
  })
})

describe('term fence', () => {
  it('refuses a lower term with 409 STALE_TERM naming the current one; an unsigned header never raises it', () => {
    const r = repo()
    const fence = new TermFence(r)
    fence.observe(7)
    fence.admit('9')
    expect(fence.term).toBe(7)
    let err: unknown
    try {
      fence.admit('6')
    } catch (e) {
      err = e
    }
    expect(err).toBeInstanceOf(AppError)
    expect((err as AppError).status).toBe(409)
    expect((err as AppError).code).toBe('STALE_TERM')
    expect((err as AppError).headers['x-cluster-term']).toBe('7')
    fence.admit('7')
    expect(fence.term).toBe(7)
  })

  it('remembers the highest term across a restart (a new fence over the same store)', () => {
    const r = repo()
    new TermFence(r).observe(42)
    expect(new TermFence(r).term).toBe(42)
  })

  it('refuses a missing or malformed term header with 400', () => {
    const fence = new TermFence(repo())
    for (const bad of [null, '', '-1', '1.5', 'abc', '9'.repeat(20)]) {
      expect(() => fence.admit(bad)).toThrow(AppError)
    }
  })
})

describe('membership', () => {
  it('calls a pod unhealthy once it has been silent for the window, and itself always healthy', () => {
    let now = 1_000
    const m = new Membership('a', 15_000, () => now)
    m.heard(pod('b', []))
    expect(m.healthy('b')).toBe(true)
    now += 14_999
    expect(m.healthy('b')).toBe(true)
    now += 1
    expect(m.healthy('b')).toBe(false)
    expect(m.healthy('a')).toBe(true)
  })

  it('reports who left the coordination service and forgets silent unregistered pods', () => {
    let now = 0
    const m = new Membership('a', 10, () => now)
    expect(
      m.registered([
        { podId: 'a', address: 'x' },
        { podId: 'b', address: 'y' },
      ]).joined,
    ).toEqual(['a', 'b'])
    expect(m.registered([{ podId: 'a', address: 'x' }]).left).toEqual(['b'])
    now = 100
    expect(m.prune()).toEqual(['b'])
    expect(m.peers()).toEqual([])
  })
})
