import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { groupPids } from '../../src/engine/process.ts'
import { smiUsedMib } from '../sim/helpers.ts'
import { groupGone, startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The liveness watch of serving engines. vLLM's API server answers /health 503 once its engine core
 * died and, with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH (or until a request meets the dead core), stays up:
 * an idle or sleeping instance would otherwise stay `active` or `sleeping` forever with its GPU
 * memory held. Here the simulator's engine core (the leader's children) is killed for real; probes
 * run every 100 ms and 3 misses fail the instance.
 */
let gw: TestGateway

type Model = { status: string; process_id: number; error?: string | null }
const model = async (id: string) => (await gw.json<{ model: Model }>(`/api/v1/models/${id}`)).body.model
const healthLines = async (id: string) =>
  (await gw.json<{ logs: string }>(`/api/v1/models/instances/${id}/logs?lines=500`)).body.logs
    .split('\n')
    .filter((l) => l.includes('"GET /health HTTP/1.1" 200')).length

/** killCore: SIGKILL every process of the engine's group but its API server (the leader). */
function killCore(leader: number): number {
  const core = groupPids(leader).filter((pid) => pid !== leader)
  for (const pid of core) process.kill(pid, 'SIGKILL')
  return core.length
}

beforeAll(async () => {
  gw = await startGateway({
    ports: [18990, 18999],
    gpus: '3x80',
    env: { VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: '1' },
    liveness: { interval_ms: 100, failures: 3, timeout_ms: 1000 },
  })
})
afterAll(async () => {
  await gw?.stop()
})

describe('engine liveness', () => {
  it('keeps a healthy sleeping engine sleeping while its probes answer 200', async () => {
    const id = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [2], enable_sleep_mode: true })
    await gw.waitStatus(id, 'active')
    const s = await gw.json<{ status: string }>(`/api/models/instances/${id}/sleep?level=1`, {
      method: 'POST',
    })
    expect(s.body.status).toBe('sleeping')
    const before = await healthLines(id)
    await waitFor('five more liveness probes answered', async () => (await healthLines(id)) >= before + 5, {
      timeoutMs: 10_000,
      pollMs: 50,
    })
    expect((await model(id)).status).toBe('sleeping')
  })

  it('fails an idle active instance whose engine core died, and stops its process group', async () => {
    const idle = smiUsedMib(gw.simDir, 0)
    const id = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [0] })
    const m = (await gw.waitStatus(id, 'active')) as unknown as Model
    expect(smiUsedMib(gw.simDir, 0)).toBeGreaterThan(idle + 1000)
    expect(killCore(m.process_id)).toBeGreaterThan(0)
    // The API server lives on, answering 503.
    expect(groupGone(m.process_id)).toBe(false)
    const failed = await gw.waitStatus(id, 'failed', 10_000)
    expect(String(failed.error)).toContain('liveness probes in a row')
    expect(String(failed.error)).toContain('engine /health answered 503')
    await waitFor('the API server stopped', () => groupGone(m.process_id), { timeoutMs: 10_000 })
    expect(smiUsedMib(gw.simDir, 0)).toBe(idle)
  })

  it('fails a sleeping instance whose engine core died (nobody would have woken it to find out)', async () => {
    const id = await gw.load({ model_path: 'facebook/opt-125m', gpu_ids: [1], enable_sleep_mode: true })
    const m = (await gw.waitStatus(id, 'active')) as unknown as Model
    const s = await gw.json<{ status: string }>(`/api/models/instances/${id}/sleep?level=1`, {
      method: 'POST',
    })
    expect(s.body.status).toBe('sleeping')
    expect(killCore(m.process_id)).toBeGreaterThan(0)
    const failed = await gw.waitStatus(id, 'failed', 10_000)
    expect(String(failed.error)).toContain('engine core is presumed dead')
    await waitFor('the API server stopped', () => groupGone(m.process_id), { timeoutMs: 10_000 })
  })
})
