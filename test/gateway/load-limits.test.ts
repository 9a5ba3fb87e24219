import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { startGateway, type TestGateway } from '../support/gateway.ts'

/**
 * What a load request may ask for, through POST /api/v1/models/load on a real host with auth on:
 * extra_args that argparse would read as a flag the load sets itself (an abbreviation such as
 * `--ho` for `--host`, in either form, in vLLM's and SGLang's terms), a flag no managed engine may
 * run with (vLLM's `--sleep-idle-ttl`), and a gpu_memory_utilization below the floor. Each is 400
 * VALIDATION_ERROR before anything is spawned, and the instance list stays empty.
 */
const AUTH = { AUTH_MODE: 'simple', ADMIN_PASSWORD: 'pw-load-limits', JWT_SECRET: 'l'.repeat(40) }

type Refusal = { error?: { code: string; message: string } }

let gw: TestGateway
let admin = ''

const load = (body: Record<string, unknown>, token: string | null = admin) =>
  gw.json<Refusal>('/api/v1/models/load', {
    method: 'POST',
    body: JSON.stringify(body),
    headers: token ? { authorization: `Bearer ${token}` } : {},
  })

const refusal = async (body: Record<string, unknown>) => {
  const r = await load(body)
  return [r.status, r.body.error?.code, r.body.error?.message] as const
}

beforeAll(async () => {
  gw = await startGateway({ ports: [27460, 27469], gpus: '2x80', hostEnv: AUTH })
  admin = (await gw.host.auth.issueToken('ops', ['admin'])).token
}, 30_000)
afterAll(async () => {
  await gw?.stop()
})

describe('extra_args of a load', () => {
  it('refuses an abbreviation argparse would read as a flag the load sets itself, spaced or with =', async () => {
    expect(
      (await load({ model_path: 'facebook/opt-125m', extra_args: ['--ho', '0.0.0.0'] }, null)).status,
    ).toBe(401)
    expect(await refusal({ model_path: 'facebook/opt-125m', extra_args: ['--ho', '0.0.0.0'] })).toEqual([
      400,
      'VALIDATION_ERROR',
      'extra_args --ho abbreviates --host (argparse accepts a unique prefix): ' +
        "extra_args must not set --host; use the load request's own field instead",
    ])
    const [status, code, message] = await refusal({
      model_path: 'facebook/opt-125m',
      extra_args: ['--enforce-eager', '--gpu-memory=0.99'],
    })
    expect([status, code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(message).toContain('extra_args --gpu-memory abbreviates --gpu-memory-utilization')
    // Underscores read as dashes, as the engines read them; -t abbreviates -tp.
    expect((await refusal({ model_path: 'm', extra_args: ['--served_model', 'x'] }))[2]).toContain(
      'extra_args --served_model abbreviates --served-model-name',
    )
    expect((await refusal({ model_path: 'm', extra_args: ['-t', '2'] }))[2]).toContain(
      'extra_args -t abbreviates -tp',
    )
    // SGLang's own flags: --mem-frac for --mem-fraction-static.
    expect(
      (await refusal({ model_path: 'm', engine_kind: 'sglang', extra_args: ['--mem-frac', '0.5'] }))[2],
    ).toContain('extra_args --mem-frac abbreviates --mem-fraction-static')
  })

  it('refuses an abbreviation of --port, which modelgate reads from extra_args itself', async () => {
    const [status, code, message] = await refusal({ model_path: 'm', extra_args: ['--por', '8123'] })
    expect([status, code]).toEqual([400, 'VALIDATION_ERROR'])
    expect(message).toBe(
      'extra_args --por abbreviates --port (argparse accepts a unique prefix): spell it --port, which modelgate reads',
    )
  })

  it("refuses vLLM's --sleep-idle-ttl and its abbreviations, saying why", async () => {
    for (const args of [['--sleep-idle-ttl', '60'], ['--sleep-idle=60']]) {
      const [status, code, message] = await refusal({ model_path: 'm', extra_args: args })
      expect([status, code]).toEqual([400, 'VALIDATION_ERROR'])
      expect(message).toContain('extra_args must not set --sleep-idle-ttl')
      expect(message).toContain('behind modelgate')
    }
  })

  it('still passes flags that are not abbreviations of a managed one (a longer one that shares its start)', async () => {
    const id = await gw.load(
      {
        model_path: 'facebook/opt-125m',
        gpu_ids: [0],
        gpu_memory_utilization: 0.2,
        extra_args: ['--enforce-eager', '--max-num-seqs', '8'],
      },
      admin,
    )
    expect(id).toBeTruthy()
    const unload = await gw.json(`/api/v1/models/${id}/unload`, {
      method: 'POST',
      headers: { authorization: `Bearer ${admin}` },
    })
    expect(unload.status).toBe(202)
  })
})

describe('gpu_memory_utilization of a load', () => {
  it('refuses a utilization below the floor of 0.05, and accepts the floor', async () => {
    for (const util of [1e-300, 0.01, 0.049]) {
      const [status, code, message] = await refusal({ model_path: 'm', gpu_memory_utilization: util })
      expect([status, code]).toEqual([400, 'VALIDATION_ERROR'])
      expect(message).toContain('gpu_memory_utilization')
    }
    const id = await gw.load(
      { model_path: 'facebook/opt-125m', gpu_ids: [1], gpu_memory_utilization: 0.05 },
      admin,
    )
    const unload = await gw.json(`/api/v1/models/${id}/unload`, {
      method: 'POST',
      headers: { authorization: `Bearer ${admin}` },
    })
    expect(unload.status).toBe(202)
  })
})
