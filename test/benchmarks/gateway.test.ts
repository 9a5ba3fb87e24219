import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { BenchmarkRun } from '../../plugins/benchmarks/schemas.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitRun } from './support.ts'

/**
 * The benchmarks plugin against the real gateway plugin: a model loaded through the gateway's API,
 * measured directly on its engine port and through the gateway's own /v1 proxy.
 */
describe('benchmarks through the real gateway', () => {
  let gw: TestGateway
  let id: string
  beforeAll(async () => {
    gw = await startGateway({
      ports: [18300, 18309],
      env: { SIM_TOKENS_PER_SEC: '200', SIM_TTFT_MS: '50' },
      extraYaml: '  benchmarks: {}\n',
      hostEnv: { INFERENCE_API_KEY: 'sk-bench' },
    })
    id = await gw.load({ model_path: 'facebook/opt-125m', gpu_memory_utilization: 0.3 })
    await gw.waitStatus(id, 'active')
  })
  afterAll(() => gw.stop())

  async function run(routingMode: 'direct' | 'proxy'): Promise<BenchmarkRun> {
    const res = await gw.json<{ benchmark: BenchmarkRun }>('/api/benchmarks', {
      method: 'POST',
      body: JSON.stringify({
        name: `opt ${routingMode}`,
        mode: 'isolated',
        scenarios: [
          {
            instanceId: id,
            routingMode,
            inputTokens: 16,
            outputTokens: 20,
            concurrency: 4,
            warmupRequests: 2,
            totalRequests: 12,
            slaThresholdMs: 5000,
          },
        ],
      }),
    })
    expect(res.status).toBe(201)
    return waitRun(gw, res.body.benchmark.id, (r) => !['pending', 'running'].includes(r.status), 30_000)
  }

  for (const mode of ['direct', 'proxy'] as const) {
    it(`measures a ${mode} scenario with the engine's own token counts`, async () => {
      const r = await run(mode)
      expect(r.status).toBe('completed')
      const s = r.scenarios[0]!
      const m = s.metrics as unknown as Record<string, number>
      expect(m.total_requests).toBe(12)
      expect(m.successful_requests).toBe(12)
      expect(m.failed_requests).toBe(0)
      expect(m.goodput_percent).toBe(100)
      // 20 tokens at 200 tok/s after a 50 ms first-token delay.
      expect(m.ttft_p50).toBeGreaterThanOrEqual(50)
      expect(m.tps_avg).toBeGreaterThan(120)
      expect(m.tps_avg).toBeLessThan(260)
      expect(m.tokens_per_second_total).toBeGreaterThan(0)
    })
  }

  it('refuses a scenario that does not fit the instance context (400 naming the scenario)', async () => {
    const res = await gw.json<{ error: { code: string; message: string } }>('/api/benchmarks', {
      method: 'POST',
      body: JSON.stringify({
        mode: 'isolated',
        scenarios: [
          {
            instanceId: id,
            inputTokens: 2000,
            outputTokens: 100,
            concurrency: 1,
            warmupRequests: 0,
            totalRequests: 1,
          },
        ],
      }),
    })
    expect(res.status).toBe(400)
    expect(res.body.error.code).toBe('VALIDATION_ERROR')
    expect(res.body.error.message).toContain('scenarios[0]')
  })
})
