import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * One figure per instance and state: what an instance holds on its GPU, as every view shows it,
 * through a real gateway, its simulated engine and nvidia-smi. The models list and an instance's
 * record, the catalogue's residency, both memory views and /metrics agree, awake and asleep (a
 * sleeping instance was 35.8 GiB on one page, 3.6 GiB on another and 15.62 GiB in a third).
 */
const MODEL = 'figures'
let gw: TestGateway
let id = ''

interface Record {
  id: string
  status: string
  memory_gib_by_gpu: { [gpu: string]: number } | null
}

const sum = (m: { [gpu: string]: number } | null) => Object.values(m ?? {}).reduce((a, b) => a + b, 0)

/** figures: what each view says the instance holds on GPU 0, in GiB. */
async function figures(): Promise<{ [view: string]: number }> {
  const list = (await gw.json<{ models: Record[] }>('/api/v1/models')).body.models.find((m) => m.id === id)!
  const detail = (await gw.json<{ model: Record }>(`/api/v1/models/${id}`)).body.model
  const residency = (
    await gw.json<{ models: { name: string; footprint_gib: number | null }[] }>('/api/residency')
  ).body.models.find((m) => m.name === MODEL)!
  const multi = (
    await gw.json<{
      gpus: { gpu_index: number; models: { instance_id: string; gpu_memory_gb: number }[] }[]
    }>('/api/memory/usage/multi-gpu')
  ).body.gpus
    .find((g) => g.gpu_index === 0)!
    .models.find((m) => m.instance_id === id)!
  const single = (
    await gw.json<{ models: { instance_id: string; gpu_memory_gb: number }[] }>('/api/memory/usage')
  ).body.models.find((m) => m.instance_id === id)!
  const metrics = await (await fetch(`${gw.url}/metrics`)).text()
  const bytes = (re: RegExp) => Number(re.exec(metrics)?.[1]) / 2 ** 30
  return {
    list: sum(list.memory_gib_by_gpu),
    detail: detail.memory_gib_by_gpu?.['0'] ?? Number.NaN,
    residency: residency.footprint_gib ?? Number.NaN,
    multi: multi.gpu_memory_gb,
    single: single.gpu_memory_gb,
    'metrics by model': bytes(
      new RegExp(`^modelgate_model_gpu_memory_bytes\\{model="${MODEL}",gpu="0"\\} (\\d+)`, 'm'),
    ),
    'metrics by instance': bytes(
      new RegExp(`^modelgate_gpu_memory_used_bytes\\{model_id="${id}"\\} (\\d+)`, 'm'),
    ),
  }
}

/** agreeing: every view's figure, within the views' rounding (0.01 GiB) of the record's. */
function expectAgreeing(f: { [view: string]: number }): number {
  const one = f.detail!
  expect(one).toBeGreaterThan(0)
  for (const [view, gib] of Object.entries(f))
    expect([view, Math.abs(gib - one) <= 0.011]).toEqual([view, true])
  return one
}

beforeAll(async () => {
  gw = await startGateway({
    ports: [26400, 26409],
    gpus: '1x80',
    extraYaml: `    residency: { policy: cost, min_resident_seconds: 0 }
    catalog:
      - { name: ${MODEL}, model_path: org/figures-7b, gpu_memory_utilization: 0.4, enable_sleep_mode: true, preload: true }
`,
  })
  const r = await waitFor(
    'the preloaded model active',
    async () =>
      (await gw.json<{ models: Record[] }>('/api/v1/models')).body.models.find((m) => m.status === 'active'),
    { timeoutMs: 30_000 },
  )
  id = r.id
})

afterAll(async () => {
  await gw?.stop()
})

describe('what an instance holds, as every view shows it', () => {
  let awake = 0

  it('is one figure awake: its footprint measured at readiness', async () => {
    awake = expectAgreeing(await figures())
    const detail = (
      await gw.json<{ model: { memory_baseline_by_gpu: { [gpu: string]: number } } }>(`/api/v1/models/${id}`)
    ).body.model
    expect(awake).toBeCloseTo(detail.memory_baseline_by_gpu['0']!, 2)
  })

  it('is one figure asleep, what the sleep left on the GPU, smaller than awake', async () => {
    const s = await gw.json(`/api/models/instances/${id}/sleep?level=1`, { method: 'POST' })
    expect(s.status).toBe(200)
    const asleep = expectAgreeing(await figures())
    expect(asleep).toBeLessThan(awake / 2)
  })

  it('is the awake figure again after the wake', async () => {
    const w = await gw.json(`/api/models/instances/${id}/wake`, { method: 'POST' })
    expect(w.status).toBe(200)
    const again = expectAgreeing(await figures())
    expect(again).toBeCloseTo(awake, 1)
  })
})
