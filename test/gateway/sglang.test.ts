import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import type { BenchmarkRun } from '../../plugins/benchmarks/schemas.ts'
import type { MemoryMetrics } from '../../plugins/gateway/api.ts'
import { groupGone, startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The engine seam proven by SGLang: one host, auth on (an admin JWT, the inference key), the
 * gateway, the router and the benchmarks, driving a simulated SGLang server (`sim sglang`, a real
 * process behind the same boundary as `sim engine`) beside a simulated vLLM one. A load names its
 * engine (`engine_kind: sglang`); everything after it (flags, readiness, memory figures, sleep as
 * release_memory_occupation, wake as resume_memory_occupation, the probes of a sleeping engine,
 * the KV usage, the router's sleep and wake, the benchmark's token counts) comes from its driver.
 */
const KEY = 'sk-sglang-seam'
const PASSWORD = 'pw-sglang-seam-1'
const SERVED = 'qwen-sglang'
const MODEL = 'Qwen/Qwen2.5-7B-Instruct'
type Json = Record<string, unknown>

let gw: TestGateway
let token = ''
let id = ''
let vllmId = ''
let routerUrl = ''

const api = async <T = Json>(path: string, method = 'GET', body?: unknown) => {
  const r = await fetch(`${gw.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await r.text()
  return { status: r.status, body: (text ? JSON.parse(text) : null) as T }
}

const instance = async (which: string) => (await api<{ model: Json }>(`/api/v1/models/${which}`)).body.model

const waitStatus = (which: string, status: string) =>
  waitFor(
    `instance ${which} to be ${status}`,
    async () => ((await instance(which)).status === status ? true : undefined),
    {
      timeoutMs: 30_000,
      wake: (notify) => gw.host.bus.on('gateway.instance.status', notify),
    },
  )

const logs = async (which: string) =>
  (await api<{ logs: string }>(`/api/v1/models/instances/${which}/logs?lines=500`)).body.logs

const chat = (base: string, model: string, extra: Json = {}, key: string | null = KEY) =>
  fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify({
      model,
      messages: [{ role: 'user', content: 'name a colour' }],
      max_tokens: 6,
      ...extra,
    }),
  })

beforeAll(async () => {
  gw = await startGateway({
    ports: [18800, 18809],
    hostEnv: {
      AUTH_MODE: 'simple',
      ADMIN_PASSWORD: PASSWORD,
      JWT_SECRET: 's'.repeat(40),
      INFERENCE_API_KEY: KEY,
    },
    env: { SIM_WAKE_DELAY_MS: '60' },
    liveness: { interval_ms: 300, failures: 2, timeout_ms: 3000 },
    extraYaml:
      '  router:\n    host: 127.0.0.1\n    port: 0\n    from_gateway: true\n    auto_sleep: { min_sleep_duration: 0 }\n' +
      '  benchmarks: {}\n',
  })
  const login = await gw.json<{ token: string }>('/api/auth/login', {
    method: 'POST',
    body: JSON.stringify({ username: 'admin', password: PASSWORD }),
  })
  token = login.body.token
  routerUrl = gw.host.urls.router!
}, 30_000)

afterAll(() => gw?.stop())

describe('an SGLang instance', () => {
  it('loads by engine_kind, as `sglang.launch_server` with its own flags, active after its warmup', async () => {
    const load = await api<{ instance_id: string }>('/api/v1/models/load', 'POST', {
      model_path: MODEL,
      served_model_name: SERVED,
      engine_kind: 'sglang',
      gpu_ids: [0],
      gpu_memory_utilization: 0.5,
      enable_sleep_mode: true,
    })
    expect(load.status).toBe(202)
    id = load.body.instance_id
    await waitStatus(id, 'active')
    const rec = await instance(id)
    expect(rec).toMatchObject({
      engine_kind: 'sglang',
      status: 'active',
      max_tokens: 32768,
      served_model_name: SERVED,
    })
    expect(rec.launch_command).toContain(' sim sglang ')
    expect(rec.launch_command).toContain(
      `--model-path ${MODEL} --port ${rec.port} --host 127.0.0.1 --served-model-name ${SERVED} ` +
        '--mem-fraction-static 0.5 --enable-memory-saver --enable-weights-cpu-backup --enable-metrics',
    )
    // Active only once SGLang said it is ready: after its warmup request.
    expect(await logs(id)).toMatch(
      /POST \/generate HTTP\/1\.1" 200 OK[\s\S]*The server is fired up and ready to roll!/,
    )
  }, 30_000)

  it('reports the memory figures its log lines give, which match what nvidia-smi shows', async () => {
    const text = await logs(id)
    // Current SGLang's lines (the simulator's default): the pool's dtype, one pair per CUDA-graph set.
    const kv =
      /KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB/.exec(
        text,
      )!
    const weights = /Load weight end\..*mem usage=([\d.]+) GB\./.exec(text)!
    const graphs = [...text.matchAll(/Capture target (\w+) CUDA graph end\..*mem usage=([\d.]+) GB/g)]
    expect(graphs.map((g) => g[1])).toEqual(['prefill', 'decode'])
    const rec = await instance(id)
    const m = rec.memory_metrics as MemoryMetrics
    expect(m.kv_cache_available_gib).toBeCloseTo(Number(kv[2]) + Number(kv[3]), 4)
    expect(m.weights_memory_gib).toBe(Number(weights[1]))
    expect(m.cuda_graph_memory_gib).toBeCloseTo(Number(graphs[0]![2]) + Number(graphs[1]![2]), 4)
    expect(m.max_model_len).toBe(32768)
    expect(m.kv_cache_per_request_mib).toBeCloseTo(
      (m.kv_cache_available_gib * 1024) / (Number(kv[1]) / 32768),
      2,
    )
    // nvidia-smi shows the pool, weights and graphs plus the CUDA context taken before the first line.
    const measured = (rec.memory_baseline_by_gpu as Record<string, number>)['0']!
    expect(Math.abs(measured - (m.total_gpu_memory_gib + 0.5))).toBeLessThan(0.05)
  }, 30_000)

  it('runs beside a vLLM instance on the same host, each answering as its engine', async () => {
    const load = await api<{ instance_id: string }>('/api/v1/models/load', 'POST', {
      model_path: 'facebook/opt-125m',
      gpu_ids: [1],
      gpu_memory_utilization: 0.3,
    })
    vllmId = load.body.instance_id
    await waitStatus(vllmId, 'active')
    const v = await instance(vllmId)
    expect(v.engine_kind).toBe('vllm')
    expect(v.launch_command).toContain(' sim engine ')
    expect(v.launch_command).toContain('facebook/opt-125m --port')
    const list = (await api<{ models: Json[] }>('/api/v1/models')).body.models
    expect(list.map((r) => [r.id, r.engine_kind]).sort()).toEqual(
      [
        [id, 'sglang'],
        [vllmId, 'vllm'],
      ].sort(),
    )
    const a = (await (await chat(gw.url, SERVED)).json()) as Json
    const b = (await (await chat(gw.url, 'facebook/opt-125m')).json()) as Json
    expect([a.model, b.model]).toEqual([SERVED, 'facebook/opt-125m'])
    // Each engine's own /v1/models, reached directly, says which engine it is.
    const owner = async (port: unknown) =>
      ((await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json()) as { data: { owned_by: string }[] })
        .data[0]!.owned_by
    expect([await owner((await instance(id)).port), await owner(v.port)]).toEqual(['sglang', 'vllm'])
  }, 30_000)

  it('is proxied, streaming and not, behind the inference key', async () => {
    const refused = await chat(gw.url, SERVED, {}, null)
    expect(refused.status).toBe(401)
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe('missing_api_key')
    const plain = await chat(gw.url, SERVED)
    expect(plain.status).toBe(200)
    const body = (await plain.json()) as { model: string; choices: { message: { content: string } }[] }
    expect(body.model).toBe(SERVED)
    expect(body.choices[0]!.message.content.split(' ')).toHaveLength(6)
    const streamed = await chat(gw.url, SERVED, { stream: true, stream_options: { include_usage: true } })
    expect(streamed.status).toBe(200)
    expect(streamed.headers.get('content-type')).toContain('text/event-stream')
    const frames = (await streamed.text())
      .split('\n\n')
      .filter((f) => f.startsWith('data: '))
      .map((f) => f.slice(6))
    expect(frames.at(-1)).toBe('[DONE]')
    const chunks = frames
      .slice(0, -1)
      .map((f) => JSON.parse(f) as { choices: { delta?: { content?: string } }[]; usage?: Json })
    expect(chunks.at(-1)!.usage).toMatchObject({ completion_tokens: 6 })
    expect(chunks.filter((c) => c.choices[0]?.delta?.content).length).toBe(6)
  }, 30_000)

  it('sleeps by releasing its memory (checked on the GPU) and wakes by resuming it', async () => {
    const slept = await api<Json>(`/api/models/instances/${id}/sleep`, 'POST')
    expect(slept.status).toBe(200)
    expect(slept.body).toMatchObject({ status: 'sleeping', sleep_level: 1, mode: null, sleep_verified: true })
    expect((slept.body.memory_check as Json).releases).toBe('weights_and_kv_cache')
    const status = await api<Json>(`/api/models/instances/${id}/sleep-status`)
    expect(status.body).toMatchObject({ status: 'sleeping', engine_is_sleeping: true, sleep_verified: true })

    // The liveness probes go on while it sleeps, on /get_model_info: a /health started on the released
    // memory would run a generation there and kill the engine (the simulator dies as SGLang would).
    await waitFor('two liveness probes of the sleeping engine', async () => {
      const after = (await logs(id)).split('POST /release_memory_occupation HTTP/1.1" 200')[1] ?? ''
      return (after.match(/GET \/get_model_info HTTP/g) ?? []).length >= 2
    })
    expect(groupGone((await instance(id)).process_id as number)).toBe(false)

    const tagged = await api<{ error: { code: string } }>(`/api/models/instances/${id}/wake`, 'POST', {
      tags: 'weights',
    })
    expect(tagged.status).toBe(400)
    expect(tagged.body.error.code).toBe('WAKE_TAGS_NOT_SUPPORTED')
    const woke = await api<Json>(`/api/models/instances/${id}/wake`, 'POST')
    expect(woke.status).toBe(200)
    expect(woke.body).toMatchObject({ status: 'running', sleep_level: 1, phases: ['resume'] })
    const again = (await (await chat(gw.url, SERVED)).json()) as {
      choices: { message: { content: string } }[]
    }
    expect(again.choices[0]!.message.content).not.toContain('!')
    expect((await logs(id)).match(/POST \/(release|resume)_memory_occupation HTTP\/1\.1" 200/g)).toEqual([
      'POST /release_memory_occupation HTTP/1.1" 200',
      'POST /resume_memory_occupation HTTP/1.1" 200',
    ])
    // A request to the sleeping model is refused (503) and starts the wake (wake_on_request: reject):
    // a second resume, through the same driver.
    expect((await api(`/api/models/instances/${id}/sleep`, 'POST')).status).toBe(200)
    const asleep = await chat(gw.url, SERVED)
    expect(asleep.status).toBe(503)
    expect(((await asleep.json()) as { error: { code: string } }).error.code).toBe('model_sleeping')
    await waitStatus(id, 'active')
    expect((await logs(id)).match(/POST \/resume_memory_occupation HTTP\/1\.1" 200/g)).toHaveLength(2)
  }, 30_000)

  it('is routed by the router, which sleeps and wakes it through the gateway', async () => {
    await waitFor('the router to follow it', async () => {
      const r = await fetch(`${routerUrl}/sleep/status`, { headers: { authorization: `Bearer ${KEY}` } })
      return (
        ((await r.json()) as { models: Record<string, { status: string }> }).models[SERVED]?.status ===
        'active'
      )
    })
    const routed = await chat(routerUrl, SERVED)
    expect(routed.status).toBe(200)
    const act = (what: string) =>
      fetch(`${routerUrl}/action/${what}/${SERVED}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEY}` },
      })
    expect((await act('sleep')).status).toBe(200)
    expect((await instance(id)).status).toBe('sleeping')
    expect((await act('wakeup')).status).toBe(200)
    expect((await instance(id)).status).toBe('active')
    expect((await chat(routerUrl, SERVED)).status).toBe(200)
  }, 30_000)

  it("is measured by the benchmark runner with its engine's own token counts, direct and proxied", async () => {
    const res = await api<{ benchmark: BenchmarkRun }>('/api/benchmarks', 'POST', {
      name: 'sglang',
      mode: 'isolated',
      scenarios: (['direct', 'proxy'] as const).map((routingMode) => ({
        instanceId: id,
        routingMode,
        inputTokens: 16,
        outputTokens: 8,
        concurrency: 2,
        warmupRequests: 1,
        totalRequests: 6,
      })),
    })
    expect(res.status).toBe(201)
    const run = await waitFor(
      'the benchmark to finish',
      async () => {
        const r = (await api<{ benchmark: BenchmarkRun }>(`/api/benchmarks/${res.body.benchmark.id}`)).body
          .benchmark
        return r.status === 'pending' || r.status === 'running' ? undefined : r
      },
      { timeoutMs: 30_000 },
    )
    expect(run.status).toBe('completed')
    for (const s of run.scenarios) {
      expect(s).toMatchObject({ prompt_source: 'tokenize', prompt_tokens: 16 })
      expect(s.metrics).toMatchObject({ total_requests: 6, successful_requests: 6, failed_requests: 0 })
    }
  }, 30_000)

  it('refuses a flag its load body owns, and fails a load SGLang refuses with its own line', async () => {
    const owned = await api<{ error: { message: string } }>('/api/v1/models/load', 'POST', {
      model_path: MODEL,
      engine_kind: 'sglang',
      extra_args: ['--mem-fraction-static', '0.3'],
    })
    expect(owned.status).toBe(400)
    expect(owned.body.error.message).toContain('extra_args must not set --mem-fraction-static')
    const foreign = await api<{ instance_id: string }>('/api/v1/models/load', 'POST', {
      model_path: 'facebook/opt-125m',
      engine_kind: 'sglang',
      gpu_ids: [1],
      gpu_memory_utilization: 0.2,
      extra_args: ['--enforce-eager'],
    })
    expect(foreign.status).toBe(202)
    await waitStatus(foreign.body.instance_id, 'failed')
    expect((await instance(foreign.body.instance_id)).error).toBe(
      'launch_server.py: error: unrecognized arguments: --enforce-eager',
    )
    await api(`/api/v1/models/${foreign.body.instance_id}/unload`, 'POST')
  }, 30_000)

  it('is saved in a configuration with its engine, and loading the configuration runs it as SGLang again', async () => {
    const saved = await api<{ configuration: { id: string; modelCount: number } }>(
      '/api/configurations',
      'POST',
      { name: 'two-engines' },
    )
    expect([saved.status, saved.body.configuration.modelCount]).toEqual([201, 2])
    const cfg = saved.body.configuration.id
    const detail = await api<{
      configuration: { entries: { servedModelName: string; engineKind: string }[] }
    }>(`/api/configurations/${cfg}`)
    expect(detail.body.configuration.entries.map((e) => [e.servedModelName, e.engineKind]).sort()).toEqual(
      [
        [SERVED, 'sglang'],
        ['facebook/opt-125m', 'vllm'],
      ].sort(),
    )
    const phases: string[] = []
    const off = gw.host.bus.on('gateway.preset.progress', (e) => phases.push(e.phase))
    try {
      expect((await api(`/api/configurations/${cfg}/load`, 'POST')).status).toBe(202)
      await waitFor(
        'the configuration to have loaded',
        () => phases.includes('completed') || phases.includes('failed'),
        {
          timeoutMs: 30_000,
          wake: (notify) => gw.host.bus.on('gateway.preset.progress', notify),
        },
      )
    } finally {
      off()
    }
    expect(phases.at(-1)).toBe('completed')
    const list = (await api<{ models: Json[] }>('/api/v1/models')).body.models
    const [sg, vl] = [SERVED, 'facebook/opt-125m'].map((n) => list.find((m) => m.served_model_name === n)!)
    expect([sg!.status, sg!.engine_kind, vl!.status, vl!.engine_kind]).toEqual([
      'active',
      'sglang',
      'active',
      'vllm',
    ])
    expect([sg!.id, vl!.id]).not.toContain(id)
    id = sg!.id as string
    expect((await instance(id)).launch_command).toContain(' sim sglang ')
    vllmId = vl!.id as string
    const res = await chat(gw.url, SERVED)
    expect(res.status).toBe(200)
    expect(((await res.json()) as Json).model).toBe(SERVED)
  }, 60_000)

  it('unloads: its process group is gone, the vLLM one serves on', async () => {
    const pgid = (await instance(id)).process_id as number
    expect((await api(`/api/v1/models/${id}/unload`, 'POST')).status).toBe(202)
    await waitFor(`the SGLang engine group ${pgid} to be gone`, () => groupGone(pgid), { timeoutMs: 15_000 })
    await waitFor(
      'the instance to be removed',
      async () => (await api(`/api/v1/models/${id}`)).status === 404,
    )
    expect((await chat(gw.url, 'facebook/opt-125m')).status).toBe(200)
  }, 30_000)
})
