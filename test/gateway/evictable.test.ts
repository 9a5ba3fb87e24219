import { afterAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { groupAlive, signalGroup } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * A load's `evictable` flag, which tells the residency manager a hand-loaded model from one it may
 * sleep or unload: default false, shown on the instance record (list and detail), and kept on the
 * instance row, so an engine adopted after a restart still carries it.
 */
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-evictable', JWT_SECRET: 'e'.repeat(40) }
const dataDir = mkdtempSync(join(tmpdir(), 'modelgate-evictable-data-'))
const simDir = mkdtempSync(join(tmpdir(), 'modelgate-evictable-sim-'))
let gw: TestGateway | undefined
const groups: number[] = []

afterAll(async () => {
  await gw?.stop()
  for (const pgid of groups) if (groupAlive(pgid)) signalGroup(pgid, 'SIGKILL')
  rmSync(dataDir, { recursive: true, force: true })
  rmSync(simDir, { recursive: true, force: true })
})

const start = (onShutdown: 'stop' | 'leave') =>
  startGateway({ ports: [27410, 27419], dataDir, simDir, onShutdown, hostEnv: AUTH })

async function call(g: TestGateway, path: string, init: RequestInit = {}) {
  const token = (await g.host.auth.issueToken('ops', ['admin'])).token
  return g.json<Record<string, unknown>>(path, { ...init, headers: { authorization: `Bearer ${token}` } })
}

async function load(g: TestGateway, body: Record<string, unknown>): Promise<string> {
  const r = await call(g, '/api/v1/models/load', { method: 'POST', body: JSON.stringify(body) })
  expect(r.status).toBe(202)
  return r.body.instance_id as string
}

/** active: the instance's record once it is active (the caller holds a token: waitStatus has none). */
async function active(g: TestGateway, id: string) {
  return waitFor(
    `instance ${id} active`,
    async () => {
      const r = await call(g, `/api/v1/models/${id}`)
      const model = r.body.model as { status: string; process_id: number } | undefined
      return model?.status === 'active' ? model : undefined
    },
    { timeoutMs: 30_000, wake: (n) => g.host.bus.on('gateway.instance.status', n) },
  )
}

const evictableOf = async (g: TestGateway) => {
  const r = await call(g, '/api/v1/models')
  return Object.fromEntries(
    (r.body.models as { served_model_name: string; evictable: boolean }[]).map((m) => [
      m.served_model_name,
      m.evictable,
    ]),
  )
}

describe('the evictable flag of a load', () => {
  it('is false unless the load asks for it, shows on the record and outlives a restart', async () => {
    gw = await start('leave')
    const byHand = await load(gw, {
      model_path: 'facebook/opt-125m',
      served_model_name: 'by-hand',
      gpu_ids: [0],
    })
    const managed = await load(gw, {
      model_path: 'facebook/opt-125m',
      served_model_name: 'managed',
      gpu_ids: [1],
      evictable: true,
    })
    for (const id of [byHand, managed]) groups.push((await active(gw, id)).process_id)
    expect(await evictableOf(gw)).toEqual({ 'by-hand': false, managed: true })
    const detail = await call(gw, `/api/v1/models/${managed}`)
    expect((detail.body.model as { evictable: boolean }).evictable).toBe(true)

    // The engines keep running while no modelgate does; the next start adopts them from their rows.
    await gw.stopKeep()
    gw = await start('stop')
    for (const id of [byHand, managed]) await active(gw, id)
    expect(await evictableOf(gw)).toEqual({ 'by-hand': false, managed: true })
  }, 90_000)

  it('must be a boolean', async () => {
    const r = await call(gw!, '/api/v1/models/load', {
      method: 'POST',
      body: JSON.stringify({ model_path: 'facebook/opt-125m', evictable: 'yes' }),
    })
    expect([r.status, (r.body.error as { code: string }).code]).toEqual([400, 'VALIDATION_ERROR'])
    expect((r.body.error as { message: string }).message).toContain('body.evictable')
  })
})
