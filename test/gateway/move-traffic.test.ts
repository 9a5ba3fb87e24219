import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { MoveEvent } from '../../plugins/gateway/move/service.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { readSse } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Zero lost requests: steady traffic through the gateway's /v1 while the model moves to another
 * GPU. Every request must succeed, before, during and after the switch, and the requests still open
 * on the source when routing switches must finish there (draining) before it is unloaded.
 */
describe('blue-green move under traffic', () => {
  let gw: TestGateway
  beforeAll(async () => {
    gw = await startGateway({
      ports: [18280, 18289],
      env: { SIM_LOAD_DELAY_MS: '600', SIM_TOKENS_PER_SEC: '100' },
    })
  })
  afterAll(() => gw.stop())

  it('serves every request while the model moves, with the right phase sequence', async () => {
    const id = await gw.load({
      model_path: 'facebook/opt-125m',
      gpu_ids: [0],
      gpu_memory_utilization: 0.2,
      served_model_name: 'opt',
    })
    await gw.waitStatus(id, 'active')

    let stop = false
    const results: { status: number; ok: boolean; error?: string }[] = []
    const worker = async (stream: boolean) => {
      while (!stop) {
        try {
          const res = await fetch(`${gw.url}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({
              model: 'opt',
              messages: [{ role: 'user', content: 'hello there' }],
              max_tokens: 12,
              ignore_eos: true,
              stream,
            }),
          })
          const text = await res.text()
          const ok =
            res.status === 200 &&
            (stream ? text.trimEnd().endsWith('data: [DONE]') : text.includes('"choices"'))
          results.push({ status: res.status, ok, ...(ok ? {} : { error: text.slice(0, 200) }) })
        } catch (err) {
          results.push({ status: 0, ok: false, error: String(err) })
        }
      }
    }
    const workers = [worker(false), worker(true), worker(true), worker(false)]
    await waitFor('a first answer from each worker', () => results.length >= workers.length)
    const before = results.length

    const res = await gw.json<{ move_id: string }>(`/api/models/instances/${id}/move`, {
      method: 'POST',
      body: JSON.stringify({ target_gpu_ids: [1], drain_timeout_ms: 10000 }),
    })
    expect(res.status).toBe(202)
    const events = await readSse(
      await fetch(`${gw.url}/api/models/moves/${res.body.move_id}/events`),
      `move ${res.body.move_id} to complete or fail`,
      (evs) => evs.some((e) => ['completed', 'failed'].includes((e.data as MoveEvent).phase)),
      30000,
    )
    // Traffic goes on after the switch: a round of answers from the target before the workers stop.
    const moved = results.length
    await waitFor('answers after the move', () => results.length >= moved + workers.length)
    stop = true
    await Promise.all(workers)

    const phases = [...new Set(events.map((e) => (e.data as MoveEvent).phase))]
    expect(phases.slice(-4)).toEqual(['switching', 'draining', 'completing', 'completed'])
    expect(phases).toContain('spawning')
    const failed = results.filter((r) => !r.ok)
    expect(failed).toEqual([])
    expect(before).toBeGreaterThan(0)
    expect(results.length).toBeGreaterThan(before + 10)
    const models = (await gw.json<{ models: { id: string; gpu_ids: number[] }[] }>('/api/v1/models')).body
      .models
    expect(models).toHaveLength(1)
    expect(models[0]!.gpu_ids).toEqual([1])
    expect(models[0]!.id).not.toBe(id)
  })
})
