import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { MoveEvent } from '../../plugins/gateway/move/service.ts'
import type { GatewayService } from '../../plugins/gateway/service.ts'
import { freePort, signalGroup, spawnEngine, waitHealthy } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { readSse } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

type Model = Record<string, unknown> & { id: string; status: string; gpu_ids: number[] }
const OPT = { model_path: 'facebook/opt-125m', gpu_memory_utilization: 0.2 }

async function finished(gw: TestGateway, moveId: string): Promise<MoveEvent[]> {
  const res = await fetch(`${gw.url}/api/models/moves/${moveId}/events`)
  expect(res.status).toBe(200)
  const events = await readSse(
    res,
    `move ${moveId} to complete or fail`,
    (evs) => evs.some((e) => ['completed', 'failed'].includes((e.data as MoveEvent).phase)),
    30000,
  )
  return events.map((e) => {
    expect(e.event).toBe('move_progress')
    return e.data as MoveEvent
  })
}

async function models(gw: TestGateway): Promise<Model[]> {
  return (await gw.json<{ models: Model[] }>('/api/v1/models')).body.models
}

async function unloadAll(gw: TestGateway) {
  for (const m of await models(gw)) await gw.json(`/api/v1/models/${m.id}/unload`, { method: 'POST' })
  await waitFor('every instance to be unloaded', async () => (await models(gw)).length === 0, {
    timeoutMs: 15_000,
    wake: (notify) => gw.host.bus.on('gateway.instance.status', notify),
  })
}

/**
 * Engine port ranges from a free port, not fixed numbers: beside a second copy of the suite, both
 * gateways claimed the same port of 18240-18259 and one engine met 'Address already in use'.
 */
const moveBase = await freePort()
const rollbackBase = await freePort()

describe('blue-green move', () => {
  let gw: TestGateway
  let service: GatewayService
  beforeAll(async () => {
    gw = await startGateway({ ports: [moveBase, moveBase + 19] })
    service = gw.host.api<GatewayService>('gateway')
  })
  afterAll(() => gw.stop())

  const move = (id: string, body: Record<string, unknown>) =>
    gw.json<Record<string, unknown> & { error?: { code: string; message: string } }>(
      `/api/models/instances/${id}/move`,
      {
        method: 'POST',
        body: JSON.stringify(body),
      },
    )

  it('moves an instance through every phase and keeps its launch settings', async () => {
    // A port asked for by extra_args (a free one: a second copy of the suite may hold the range's).
    const asked = String(await freePort())
    const id = await gw.load({
      ...OPT,
      gpu_ids: [0],
      enable_sleep_mode: true,
      served_model_name: 'opt',
      extra_args: ['--enforce-eager', '--port', asked],
    })
    await gw.waitStatus(id, 'active')
    const res = await move(id, { target_gpu_ids: [1], drain_timeout_ms: 5000 })
    expect(res.status).toBe(202)
    expect(res.body).toMatchObject({ instance_id: id, phase: 'validating', target_gpu_ids: [1] })
    const events = await finished(gw, res.body.move_id as string)
    const phases = [...new Set(events.map((e) => e.phase))]
    expect(phases).toEqual(['spawning', 'switching', 'draining', 'completing', 'completed'])
    const progress = events.filter((e) => e.phase === 'spawning').map((e) => e.progress!)
    expect(progress[0]).toBe(0)
    expect(progress.at(-1)).toBe(100)
    expect([...progress].sort((a, b) => a - b)).toEqual(progress)
    expect(events.filter((e) => e.phase !== 'spawning').every((e) => e.progress === null)).toBe(true)

    const after = await models(gw)
    expect(after.map((m) => m.id)).not.toContain(id)
    expect(after).toHaveLength(1)
    expect(after[0]).toMatchObject({
      status: 'active',
      gpu_ids: [1],
      served_model_name: 'opt',
      model_path: 'facebook/opt-125m',
      enable_sleep_mode: true,
      extra_args: ['--enforce-eager'],
      gpu_memory_utilization: 0.2,
    })
    // A late subscriber to a finished move gets its final state and the stream ends.
    const late = await finished(gw, res.body.move_id as string)
    expect(late.map((e) => e.phase)).toEqual(['completed'])
    await unloadAll(gw)
  })

  it('validates a move request', async () => {
    const a = await gw.load({ ...OPT, gpu_ids: [0] })
    await gw.waitStatus(a, 'active')
    expect((await move('nope', { target_gpu_ids: [1] })).status).toBe(404)
    const same = await move(a, { target_gpu_ids: [0] })
    expect(same.status).toBe(400)
    expect(same.body.error?.message).toContain('differ')
    expect((await move(a, { target_gpu_ids: [0, 1] })).status).toBe(400)
    expect((await move(a, { target_gpu_ids: [5] })).status).toBe(400)
    expect((await move(a, {})).status).toBe(400)

    const starting = await gw.load({ ...OPT, gpu_ids: [1] })
    expect((await move(starting, { target_gpu_ids: [0] })).status).toBe(400)
    await gw.waitStatus(starting, 'active')

    const big = await gw.load({
      model_path: 'Qwen/Qwen2.5-7B-Instruct',
      gpu_ids: [1],
      gpu_memory_utilization: 0.7,
    })
    await gw.waitStatus(big, 'active')
    const full = await move(a, { target_gpu_ids: [1] })
    expect(full.status).toBe(400)
    expect(full.body.error?.code).toBe('INSUFFICIENT_MEMORY')

    const first = await move(starting, { target_gpu_ids: [0] })
    expect(first.status).toBe(202)
    const second = await move(a, { target_gpu_ids: [1] })
    expect(second.status).toBe(409)
    await finished(gw, first.body.move_id as string)
    await unloadAll(gw)
  })

  /** cancelAt starts a move and cancels it from the progress bus at the first event of `phase`. */
  async function cancelAt(phase: string, force: boolean, holdLease = false) {
    const id = await gw.load({ ...OPT, gpu_ids: [0], served_model_name: `cancel-${phase}-${force}` })
    await gw.waitStatus(id, 'active')
    const lease = holdLease ? service.acquire(`cancel-${phase}-${force}`) : null
    let outcome: unknown = 'not reached'
    const off = gw.host.bus.on('gateway.move.progress', (e) => {
      if (e.phase !== phase || outcome !== 'not reached') return
      try {
        service.moves.cancel(e.move_id, force)
        outcome = 204
      } catch (err) {
        outcome = (err as { status?: number }).status
      }
    })
    const res = await move(id, { target_gpu_ids: [1], drain_timeout_ms: 20000 })
    expect(res.status).toBe(202)
    const events = await finished(gw, res.body.move_id as string)
    off()
    lease?.release()
    const final = events.at(-1)!
    const remaining = await models(gw)
    await unloadAll(gw)
    return { id, outcome, final, remaining }
  }

  it('cancel in validating aborts at once', async () => {
    const r = await cancelAt('validating', false)
    expect(r.outcome).toBe(204)
    expect(r.final).toMatchObject({ phase: 'failed', error: 'cancelled' })
    expect(r.remaining.map((m) => m.id)).toEqual([r.id])
  })

  for (const force of [false, true]) {
    it(`cancel in spawning kills the target and keeps the source (force=${force})`, async () => {
      const r = await cancelAt('spawning', force)
      expect(r.outcome).toBe(204)
      expect(r.final).toMatchObject({ phase: 'failed', error: 'cancelled' })
      expect(r.remaining).toHaveLength(1)
      expect(r.remaining[0]).toMatchObject({ id: r.id, status: 'active', gpu_ids: [0] })
    })
  }

  for (const phase of ['switching', 'draining']) {
    it(`cancel in ${phase} without force reverts to the source and unloads the target`, async () => {
      const r = await cancelAt(phase, false, phase === 'draining')
      expect(r.outcome).toBe(204)
      expect(r.final).toMatchObject({ phase: 'failed', error: 'cancelled' })
      expect(r.remaining.map((m) => m.id)).toEqual([r.id])
      expect(service.instances.size).toBe(0)
    })

    it(`cancel in ${phase} with force completes at once and unloads the source`, async () => {
      const r = await cancelAt(phase, true, phase === 'draining')
      expect(r.outcome).toBe(204)
      expect(r.final.phase).toBe('completed')
      expect(r.remaining).toHaveLength(1)
      expect(r.remaining[0]!.id).not.toBe(r.id)
      expect(r.remaining[0]!.gpu_ids).toEqual([1])
    })
  }

  it('a cancel after the switch lets the requests the target took finish before it unloads', async () => {
    const name = 'cancel-after-switch'
    const id = await gw.load({ ...OPT, gpu_ids: [0], served_model_name: name })
    await gw.waitStatus(id, 'active')
    // A request held on the source keeps the move draining.
    const held = service.acquire(name)
    const res = await move(id, { target_gpu_ids: [1], drain_timeout_ms: 20000 })
    expect(res.status).toBe(202)
    const moveId = res.body.move_id as string
    await waitFor(`move ${moveId} to reach draining`, () => service.moves.get(moveId)?.phase === 'draining', {
      timeoutMs: 15_000,
      wake: (notify) => gw.host.bus.on('gateway.move.progress', notify),
    })
    // The source takes no new request now: this stream (2 s at 200 tokens/s) runs on the target.
    const chat = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: name,
        messages: [{ role: 'user', content: 'count' }],
        max_tokens: 400,
        ignore_eos: true,
        stream: true,
      }),
    })
    expect(chat.status).toBe(200)
    const text = chat.text().catch((err) => `cut: ${err}`)
    const target = service.moves.get(moveId)!.target_instance_id!
    expect(service.inFlight(target)).toBe(1)
    const del = await fetch(`${gw.url}/api/models/moves/${moveId}`, { method: 'DELETE' })
    expect(del.status).toBe(204)
    held.release()
    // Every token it asked for, then [DONE]: not cut by an error event when the target unloads.
    const got = await text
    expect(got).not.toContain('"error"')
    expect(got).toContain('"finish_reason":"length"')
    expect(got.trimEnd().endsWith('data: [DONE]')).toBe(true)
    const events = await finished(gw, moveId)
    expect(events.at(-1)).toMatchObject({ phase: 'failed', error: 'cancelled' })
    expect((await models(gw)).map((m) => m.id)).toEqual([id])
    await unloadAll(gw)
  })

  it('refuses to cancel when completing (too late), completed, failed or unknown', async () => {
    const r = await cancelAt('completing', false)
    expect(r.outcome).toBe(409)
    expect(r.final.phase).toBe('completed')
    const moveId = r.final.move_id
    const again = await gw.json<{ error: { code: string } }>(`/api/models/moves/${moveId}`, {
      method: 'DELETE',
    })
    expect(again.status).toBe(409)
    expect(again.body.error.code).toBe('MOVE_NOT_CANCELLABLE')
    expect((await gw.json('/api/models/moves/mv-unknown', { method: 'DELETE' })).status).toBe(404)
    expect((await gw.json('/api/models/moves/mv-unknown/events')).status).toBe(404)
  })

  it('cancels over HTTP with 204 while the target loads', async () => {
    const id = await gw.load({ ...OPT, gpu_ids: [0] })
    await gw.waitStatus(id, 'active')
    const res = await move(id, { target_gpu_ids: [1] })
    const moveId = res.body.move_id as string
    await waitFor(`move ${moveId} to reach spawning`, () => service.moves.get(moveId)?.phase === 'spawning', {
      timeoutMs: 5000,
      wake: (notify) => gw.host.bus.on('gateway.move.progress', notify),
    })
    const del = await fetch(`${gw.url}/api/models/moves/${moveId}?force=false`, { method: 'DELETE' })
    expect(del.status).toBe(204)
    const events = await finished(gw, moveId)
    expect(events.at(-1)).toMatchObject({ phase: 'failed', error: 'cancelled' })
    expect((await models(gw)).map((m) => m.id)).toEqual([id])
    await unloadAll(gw)
  })
})

describe('blue-green move rollback', () => {
  it('leaves the source unchanged when the target fails to start', async () => {
    // The engines see GPU 1 taken by a process nvidia-smi does not show, so only the engine's own check fails.
    const engineDir = mkdtempSync(join(tmpdir(), 'modelgate-move-full-'))
    const smiDir = mkdtempSync(join(tmpdir(), 'modelgate-move-empty-'))
    const hog = await spawnEngine(
      'Qwen/Qwen2.5-7B-Instruct',
      ['--sim-dir', engineDir],
      { CUDA_VISIBLE_DEVICES: '1', SIM_LOAD_DELAY_MS: '100' },
      await freePort(),
    )
    const gw = await startGateway({
      ports: [rollbackBase, rollbackBase + 9],
      simDir: engineDir,
      smiSimDir: smiDir,
    })
    try {
      await waitHealthy(hog)
      const id = await gw.load({ model_path: 'Qwen/Qwen2.5-7B-Instruct', gpu_ids: [0] })
      const before = await gw.waitStatus(id, 'active')
      const res = await gw.json<{ move_id: string }>(`/api/models/instances/${id}/move`, {
        method: 'POST',
        body: JSON.stringify({ target_gpu_ids: [1] }),
      })
      expect(res.status).toBe(202)
      const events = await finished(gw, res.body.move_id)
      expect(events.at(-1)!.phase).toBe('failed')
      expect(events.at(-1)!.error).toContain('Free memory on device')
      const after = (await gw.json<{ models: Model[] }>('/api/v1/models')).body.models
      expect(after).toHaveLength(1)
      expect(after[0]).toMatchObject({
        id,
        status: 'active',
        gpu_ids: [0],
        process_id: before.process_id,
        port: before.port,
      })
      const lease = gw.host.api<GatewayService>('gateway').acquire(id)
      expect(lease.instanceId).toBe(id)
      lease.release()
    } finally {
      await gw.stop()
      signalGroup(hog.pid, 'SIGTERM')
      await hog.exited
      rmSync(engineDir, { recursive: true, force: true })
      rmSync(smiDir, { recursive: true, force: true })
    }
  })
})
