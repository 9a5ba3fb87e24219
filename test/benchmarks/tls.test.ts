import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { BenchmarkRun } from '../../plugins/benchmarks/schemas.ts'
import { makeCert } from '../support/certs.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * A proxy-mode benchmark calls the host's own main listener: with `server.tls` it goes to its
 * https:// URL and trusts the configured (here self-signed) certificate, verification on.
 */
describe('benchmarks in proxy mode with server.tls', () => {
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-bench-tls-'))
  let gw: TestGateway
  let id: string
  beforeAll(async () => {
    const { certFile, keyFile } = makeCert(dir, 'bench', 'bench')
    gw = await startGateway({
      ports: [26310, 26319],
      env: { SIM_TOKENS_PER_SEC: '400', SIM_TTFT_MS: '20' },
      extraYaml: '  benchmarks: {}\n',
      hostEnv: { INFERENCE_API_KEY: 'sk-bench' },
      server: { tls: { cert_file: certFile, key_file: keyFile } },
    })
    id = await gw.load({ model_path: 'facebook/opt-125m', gpu_memory_utilization: 0.3 })
    await gw.waitStatus(id, 'active')
  })
  afterAll(async () => {
    await gw?.stop()
    rmSync(dir, { recursive: true, force: true })
  })

  it('measures every request through https://', async () => {
    expect(gw.url).toStartWith('https://')
    const res = await gw.json<{ benchmark: BenchmarkRun }>('/api/benchmarks', {
      method: 'POST',
      body: JSON.stringify({
        name: 'opt proxy over tls',
        mode: 'isolated',
        scenarios: [
          {
            instanceId: id,
            routingMode: 'proxy',
            inputTokens: 16,
            outputTokens: 10,
            concurrency: 2,
            warmupRequests: 1,
            totalRequests: 6,
            slaThresholdMs: 5000,
          },
        ],
      }),
    })
    expect(res.status).toBe(201)
    const run = await waitFor(
      'the run to end',
      async () => {
        const r = await gw.json<{ benchmark: BenchmarkRun }>(`/api/benchmarks/${res.body.benchmark.id}`)
        return ['pending', 'running'].includes(r.body.benchmark.status) ? null : r.body.benchmark
      },
      { timeoutMs: 30_000, pollMs: 100 },
    )
    expect(run.status).toBe('completed')
    const m = run.scenarios[0]!.metrics as unknown as Record<string, number>
    expect({ ok: m.successful_requests, failed: m.failed_requests }).toEqual({ ok: 6, failed: 0 })
  })
})
