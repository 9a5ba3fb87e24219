import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { GatewayService } from '../../plugins/gateway/service.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/** Races between requests that reach the gateway at the same moment. */
describe('gateway under concurrent requests', () => {
  let gw: TestGateway
  beforeAll(async () => {
    // Engines ignore SIGTERM here, so an unloaded engine still answers while its grace period runs
    // (0.5 s: ten times what the simulator takes to fall asleep).
    gw = await startGateway({
      ports: [18120, 18129],
      env: { SIM_WAKE_DELAY_MS: '300', SIM_HANG_ON_TERM: '1' },
      stopGraceSeconds: 0.5,
    })
  })
  afterAll(() => gw.stop())

  it('places simultaneous loads on different GPUs and refuses the one that fits nowhere', async () => {
    const body = JSON.stringify({ model_path: 'Qwen/Qwen2.5-7B-Instruct', enable_sleep_mode: true })
    const res = await Promise.all(
      [0, 1, 2].map(() =>
        gw.json<{ instance_id?: string; error?: { code: string } }>('/api/v1/models/load', {
          method: 'POST',
          body,
        }),
      ),
    )
    const started = res.filter((r) => r.status === 202)
    expect(started).toHaveLength(2)
    const refused = res.filter((r) => r.status === 400)
    expect(refused.map((r) => r.body.error?.code)).toEqual(['INSUFFICIENT_MEMORY'])
    const models = await Promise.all(started.map((r) => gw.waitStatus(r.body.instance_id!, 'active')))
    expect(models.map((m) => (m.gpu_ids as number[])[0]).sort()).toEqual([0, 1])
  })

  it('sends no new request to an instance while it is going to sleep', async () => {
    const service = gw.host.api<GatewayService>('gateway')
    const [a] = service.list()
    const sleeping = service.sleep(a!.id, 1)
    expect(() => service.acquire(a!.id)).toThrow(
      expect.objectContaining({ status: 503, code: 'model_sleeping' }),
    )
    await sleeping
    expect(() => service.acquire(a!.id)).toThrow(expect.objectContaining({ code: 'model_sleeping' }))
    await service.wake(a!.id)
    const lease = service.acquire(a!.id)
    expect(lease.instanceId).toBe(a!.id)
    lease.release()
  })

  it('does not bring back an instance unloaded while it was going to sleep', async () => {
    const service = gw.host.api<GatewayService>('gateway')
    const [, b] = service.list()
    const sleeping = service.sleep(b!.id, 1).catch((err: { status?: number }) => err.status)
    await service.unload(b!.id)
    expect(await sleeping).toBe(409)
    await waitFor(`instance ${b!.id} to be gone`, () => service.get(b!.id) === undefined, {
      timeoutMs: 15_000,
      wake: (notify) => gw.host.bus.on('gateway.instance.status', notify),
    })
    expect(service.get(b!.id)).toBeUndefined()
    // Nothing brings it back: not the next health checks (health_poll_ms max 200 ms here).
    await Bun.sleep(200)
    expect(service.get(b!.id)).toBeUndefined()
    expect((await gw.json(`/api/v1/models/${b!.id}`)).status).toBe(404)
  })
})
