import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { rmSync } from 'node:fs'
import benchmarks from '../../plugins/benchmarks/index.ts'
import { RunRepository } from '../../plugins/benchmarks/repo.ts'
import type { BenchmarkRun, RunSummary } from '../../plugins/benchmarks/schemas.ts'
import { applyMigrations, openStore } from '../../src/store/db.ts'
import { cleanupSims, type EngineProc } from '../sim/helpers.ts'
import { type TestHost, tempDataDir } from '../support/host.ts'
import {
  api,
  bootHost,
  createRun,
  fakeGateway,
  getRun,
  instance,
  startSim,
  syntheticRun,
  waitRun,
} from './support.ts'

/** What survives a restart: pagination over stored runs, export/import, interrupted runs. */
let engine: EngineProc

beforeAll(async () => {
  engine = await startSim({ SIM_TOKENS_PER_SEC: '500', SIM_TTFT_MS: '10' })
})

afterAll(cleanupSims)

const at = (i: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, i)).toISOString()

type Page = { benchmarks: RunSummary[]; total: number; page: number; limit: number }
type Bundle = { format: string; version: number; exported_at: string; runs: BenchmarkRun[] }
type Imported = {
  imported: number
  skipped: number
  imported_ids: string[]
  skipped_runs: { id: string; reason: string }[]
}

describe('benchmark list pagination', () => {
  let th: TestHost
  beforeAll(async () => {
    th = await bootHost(fakeGateway())
    const runs = Array.from({ length: 25 }, (_, i) =>
      syntheticRun(
        `run-${String(i).padStart(2, '0')}`,
        at(i),
        i % 5 === 0 ? { status: 'failed', error: 'x' } : {},
      ),
    )
    const res = await api<Imported>(th.url, 'POST', '/api/benchmarks/import', {
      format: 'modelgate.benchmarks',
      version: 1,
      exported_at: at(99),
      source: { modelgate_version: 'test' },
      runs,
    })
    expect(res.body.imported).toBe(25)
  })
  afterAll(() => th.stop())

  it('defaults to page 1 of 20, newest first, with the total', async () => {
    const res = await api<Page>(th.url, 'GET', '/api/benchmarks')
    expect(res.status).toBe(200)
    expect(res.body.page).toBe(1)
    expect(res.body.limit).toBe(20)
    expect(res.body.total).toBe(25)
    expect(res.body.benchmarks).toHaveLength(20)
    expect(res.body.benchmarks[0]!.id).toBe('run-24')
    expect(res.body.benchmarks[0]).toMatchObject({
      scenario_count: 1,
      model_names: ['opt-125m'],
      status: 'completed',
    })
    expect((res.body.benchmarks[0] as Record<string, unknown>).scenarios).toBeUndefined()
  })

  it('pages with page and limit, and caps limit at 100', async () => {
    const second = await api<Page>(th.url, 'GET', '/api/benchmarks?page=2&limit=10')
    expect(second.body.benchmarks.map((b) => b.id)).toEqual(
      Array.from({ length: 10 }, (_, i) => `run-${String(14 - i).padStart(2, '0')}`),
    )
    const last = await api<Page>(th.url, 'GET', '/api/benchmarks?page=3&limit=10')
    expect(last.body.benchmarks).toHaveLength(5)
    const beyond = await api<Page>(th.url, 'GET', '/api/benchmarks?page=9&limit=10')
    expect(beyond.body).toMatchObject({ benchmarks: [], total: 25, page: 9 })
    const capped = await api<Page>(th.url, 'GET', '/api/benchmarks?limit=500')
    expect(capped.body.limit).toBe(100)
    expect(capped.body.benchmarks).toHaveLength(25)
  })

  it('filters by status', async () => {
    const failed = await api<Page>(th.url, 'GET', '/api/benchmarks?status=failed')
    expect(failed.body.total).toBe(5)
    expect(failed.body.benchmarks.every((b) => b.status === 'failed')).toBe(true)
    expect((await api<Page>(th.url, 'GET', '/api/benchmarks?status=running')).body.total).toBe(0)
  })

  it('refuses a bad page, limit or status with 400', async () => {
    for (const q of ['page=0', 'limit=0', 'page=abc', 'status=done']) {
      const res = await api<{ error: { code: string } }>(th.url, 'GET', `/api/benchmarks?${q}`)
      expect(res.status).toBe(400)
      expect(res.body.error.code).toBe('VALIDATION_ERROR')
    }
  })
})

describe('benchmark export and import', () => {
  it('round-trips finished runs into another host and skips runs that exist', async () => {
    const gw = fakeGateway([instance('steady', engine.port)])
    const a = await bootHost(gw)
    const b = await bootHost(fakeGateway())
    try {
      const run = await createRun(a.url, 'isolated', [
        {
          instanceId: 'steady',
          inputTokens: 8,
          outputTokens: 4,
          concurrency: 2,
          warmupRequests: 1,
          totalRequests: 4,
        },
      ])
      const done = await waitRun(a, run.id)
      const bundle = (await api<Bundle>(a.url, 'GET', '/api/benchmarks/export')).body
      expect(bundle).toMatchObject({ format: 'modelgate.benchmarks', version: 1 })
      expect(bundle.runs.map((r) => r.id)).toEqual([run.id])
      const first = await api<Imported>(b.url, 'POST', '/api/benchmarks/import', bundle)
      expect(first.status).toBe(200)
      expect(first.body).toMatchObject({ imported: 1, skipped: 0, imported_ids: [run.id] })
      expect(await getRun(b.url, run.id)).toEqual(done)
      const again = await api<Imported>(b.url, 'POST', '/api/benchmarks/import', bundle)
      expect(again.body).toMatchObject({
        imported: 0,
        skipped: 1,
        skipped_runs: [{ id: run.id, reason: 'already exists' }],
      })
      const wrong = await api<{ error: { code: string } }>(b.url, 'POST', '/api/benchmarks/import', {
        ...bundle,
        version: 2,
      })
      expect(wrong.status).toBe(400)
      expect(wrong.body.error.code).toBe('VALIDATION_ERROR')
      expect(
        (await api(b.url, 'POST', '/api/benchmarks/import', { ...bundle, format: 'other' })).status,
      ).toBe(400)
    } finally {
      await a.stop()
      await b.stop()
    }
  })
})

describe('benchmark runs across restarts', () => {
  it('marks a run left running in the store as failed with a reason on start-up', async () => {
    const dataDir = tempDataDir()
    const store = openStore(dataDir)
    applyMigrations(store, 'benchmarks', benchmarks.migrations ?? [])
    const repo = new RunRepository(store.db)
    const base = syntheticRun('left-running', at(1))
    const done = base.scenarios[0]!
    const running: BenchmarkRun = {
      ...base,
      status: 'running',
      completed_at: null,
      scenarios: [
        done,
        { ...done, id: 'left-running-s1', status: 'running', phase: 'measuring', metrics: undefined },
      ],
    }
    delete running.scenarios[1]!.metrics
    repo.insert(running)
    repo.insert({
      ...syntheticRun('left-pending', at(2)),
      status: 'pending',
      started_at: null,
      completed_at: null,
    })
    store.close()

    const th = await bootHost(fakeGateway(), { dataDir })
    try {
      const run = await getRun(th.url, 'left-running')
      expect(run.status).toBe('failed')
      expect(run.error).toBe('interrupted: modelgate restarted while this run was running')
      expect(run.completed_at).not.toBeNull()
      expect(run.scenarios[0]!.status).toBe('completed')
      expect(run.scenarios[0]!.metrics).toBeDefined()
      expect(run.scenarios[1]).toMatchObject({ status: 'failed', phase: 'done', error: run.error })
      const pending = await getRun(th.url, 'left-pending')
      expect(pending.status).toBe('failed')
      expect(pending.error).toContain('before this run started')
    } finally {
      await th.stop()
    }
  })

  it('fails a run that is running when modelgate shuts down, and keeps it failed after a restart', async () => {
    const slow = await startSim({ SIM_TOKENS_PER_SEC: '20' })
    const gw = fakeGateway([instance('slow', slow.port)])
    const dataDir = tempDataDir()
    const first = await bootHost(gw, { dataDir })
    const run = await createRun(first.url, 'isolated', [
      {
        instanceId: 'slow',
        inputTokens: 8,
        outputTokens: 200,
        concurrency: 2,
        warmupRequests: 0,
        totalRequests: 2,
      },
    ])
    await waitRun(first, run.id, (r) => r.scenarios[0]!.phase === 'measuring')
    await first.stopKeep()
    const second = await bootHost(gw, { dataDir })
    try {
      const after = await getRun(second.url, run.id)
      expect(after.status).toBe('failed')
      expect(after.error).toBe('interrupted: modelgate shut down while this run was in progress')
      expect(after.scenarios[0]!.status).toBe('failed')
    } finally {
      await second.stopKeep()
      rmSync(dataDir, { recursive: true, force: true })
    }
  })
})
