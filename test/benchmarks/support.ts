import { Type as T } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import benchmarks from '../../plugins/benchmarks/index.ts'
import type { BenchmarkRun } from '../../plugins/benchmarks/schemas.ts'
import { ScenarioRecorder } from '../../plugins/benchmarks/statistics.ts'
import type { GatewayApi, InstanceRecord } from '../../plugins/gateway/api.ts'
import { abortable } from '../../src/host/abortable.ts'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import { type EngineProc, spawnEngine, tempSimDir, waitHealthy } from '../sim/helpers.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { readSse, type SseMessage } from '../support/sse.ts'
import { waitFor } from '../support/wait.ts'

/**
 * Test support for the benchmarks plugin: a fake `gateway` plugin whose instances point at engines
 * the test spawned (with a tiny /v1/completions pass-through so proxy routing can be exercised),
 * a Host booted on a chosen data dir, simulator engines, and small HTTP/SSE helpers.
 */
export function instance(id: string, port: number, extra: Partial<InstanceRecord> = {}): InstanceRecord {
  const model = extra.model_path ?? 'facebook/opt-125m'
  return {
    id,
    model_path: model,
    model_name: model.split('/').pop() ?? model,
    served_model_name: model,
    engine_kind: 'vllm',
    status: 'active',
    port,
    process_id: null,
    max_tokens: 2048,
    gpu_memory_utilization: 0.9,
    gpu_ids: [0],
    tensor_parallel_size: 1,
    sharedcache_enabled: false,
    enable_sleep_mode: false,
    sleep_level: null,
    slept_at: null,
    loaded_at: new Date().toISOString(),
    ready_at: new Date().toISOString(),
    extra_args: [],
    error: null,
    evictable: false,
    memory_metrics: null,
    memory_baseline_by_gpu: null,
    memory_gib_by_gpu: null,
    launch_command: '',
    ...extra,
  }
}

export interface FakeGateway {
  plugin: PluginDefinition
  instances: Map<string, InstanceRecord>
  /** proxied counts /v1/completions requests through the fake proxy, by Authorization header. */
  proxied: Map<string, number>
}

/**
 * fakeGateway: `requireKey`, when set, makes its /v1/completions answer 401 `invalid_api_key` (the
 * body the gateway's own key check sends) to a request without `Bearer <requireKey>`.
 */
export function fakeGateway(list: InstanceRecord[] = [], opts: { requireKey?: string } = {}): FakeGateway {
  const instances = new Map(list.map((i) => [i.id, i]))
  const proxied = new Map<string, number>()
  const unsupported = () => {
    throw new Error('not supported by the fake gateway')
  }
  const api: GatewayApi = {
    list: () => [...instances.values()],
    get: (id) => instances.get(id),
    load: unsupported,
    unload: unsupported,
    sleep: unsupported,
    wake: unsupported,
    engineBaseUrl: (i) => `http://127.0.0.1:${i.port}`,
    backends: () => [],
    acquireByPort: () => null,
    inFlight: () => 0,
    moveInProgress: () => false,
    gpuSnapshot: async () => ({ available: false as const, reason: 'no GPUs in this fake' }),
    gpuReading: async () => ({ available: false as const, reason: 'no GPUs in this fake' }),
    catalog: () => [],
    catalogEntry: () => undefined,
    saveCatalogEntry: unsupported,
    removeCatalogEntry: unsupported,
  }
  const plugin = definePlugin({
    id: 'gateway',
    description: 'fake gateway for benchmark tests',
    config: T.Object({}, { additionalProperties: false }),
    setup: () => ({
      api,
      routes: new Elysia().post(
        '/v1/completions',
        async ({ request }) => {
          const body = (await request.json()) as { model: string }
          const target = instances.get(body.model)
          if (!target) return Response.json({ error: { message: 'unknown model' } }, { status: 400 })
          const auth = request.headers.get('authorization') ?? '(none)'
          proxied.set(auth, (proxied.get(auth) ?? 0) + 1)
          if (opts.requireKey !== undefined && auth !== `Bearer ${opts.requireKey}`)
            return Response.json(
              {
                error: { message: 'Invalid API key', type: 'authentication_error', code: 'invalid_api_key' },
              },
              { status: 401 },
            )
          const upstream = await fetch(`http://127.0.0.1:${target.port}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ ...body, model: target.served_model_name }),
            signal: request.signal,
          })
          return new Response(upstream.body, { status: upstream.status, headers: upstream.headers })
        },
        // The handler reads the bytes itself, as the gateway's proxy does: Elysia must not parse them first.
        { parse: 'none' },
      ),
    }),
  }) as unknown as PluginDefinition
  return { plugin, instances, proxied }
}

/** bootHost boots the benchmarks plugin beside `gateway` through the one Host booter. */
export async function bootHost(
  gateway: FakeGateway,
  opts: { dataDir?: string; env?: Record<string, string>; benchmarksYaml?: string } = {},
): Promise<TestHost> {
  const yaml =
    'log: { level: warn }\n' +
    `plugins:\n  gateway: {}\n  benchmarks: ${opts.benchmarksYaml ?? '{ progress_interval_ms: 0 }'}\n`
  const defs = [gateway.plugin, benchmarks as unknown as PluginDefinition]
  return startHost(yaml, defs, opts.env ?? {}, opts.dataDir)
}

/** startSim spawns a simulator engine with the given knobs and waits until it is healthy. */
export async function startSim(env: Record<string, string>, args: string[] = []): Promise<EngineProc> {
  const e = await spawnEngine(
    'facebook/opt-125m',
    ['--sim-dir', tempSimDir(), '--sim-gpus', '2x80', ...args],
    { SIM_LOAD_DELAY_MS: '100', ...env },
  )
  await waitHealthy(e)
  return e
}

export interface ScenarioInput {
  instanceId: string
  routingMode?: 'direct' | 'proxy'
  inputTokens: number
  outputTokens: number
  concurrency: number
  warmupRequests: number
  totalRequests: number
  slaThresholdMs?: number
  slaTtftMs?: number
  slaTpotMs?: number
  requestRate?: number
}

export async function api<T = unknown>(
  base: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<{ status: number; body: T }> {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: (text ? JSON.parse(text) : null) as T }
}

export async function createRun(
  base: string,
  mode: 'isolated' | 'contention',
  scenarios: ScenarioInput[],
  name?: string,
): Promise<BenchmarkRun> {
  const res = await api<{ benchmark: BenchmarkRun }>(base, 'POST', '/api/benchmarks', {
    name,
    mode,
    scenarios,
  })
  if (res.status !== 201) throw new Error(`create failed: ${res.status} ${JSON.stringify(res.body)}`)
  return res.body.benchmark
}

export async function getRun(base: string, id: string): Promise<BenchmarkRun> {
  const res = await api<{ benchmark: BenchmarkRun }>(base, 'GET', `/api/benchmarks/${id}`)
  if (res.status !== 200) throw new Error(`get failed: ${res.status} ${JSON.stringify(res.body)}`)
  return res.body.benchmark
}

/** waitRun waits until `done(run)` holds, checking again on each `benchmarks.event` on the host's bus. */
export async function waitRun(
  th: TestHost,
  id: string,
  done: (r: BenchmarkRun) => boolean = (r) => ['completed', 'failed', 'cancelled'].includes(r.status),
  ms = 20_000,
): Promise<BenchmarkRun> {
  let last: BenchmarkRun | undefined
  return waitFor(
    `run ${id} to reach ${done.toString()}`,
    async () => {
      last = await getRun(th.url, id)
      return done(last) ? last : undefined
    },
    { timeoutMs: ms, wake: (notify) => th.host.bus.on('benchmarks.event', notify), show: () => last },
  )
}

/** readEvents reads a run's event stream until the server ends it (throws if it does not in `ms`). */
export async function readEvents(url: string, ms = 20_000): Promise<SseMessage<Record<string, unknown>>[]> {
  const res = await abortable(fetch(url), { timeoutMs: ms, what: `the head of ${url}` })
  return readSse<Record<string, unknown>>(res, `the end of ${url}`, undefined, ms)
}

/** syntheticRun builds a finished run resource (for import and restart tests). */
export function syntheticRun(id: string, createdAt: string, over: Partial<BenchmarkRun> = {}): BenchmarkRun {
  const metrics = new ScenarioRecorder({ e2eMs: null, ttftMs: null, tpotMs: null }).summarize(1)
  return {
    id,
    name: `run ${id}`,
    status: 'completed',
    mode: 'isolated',
    sharedcache_enabled: false,
    created_at: createdAt,
    started_at: createdAt,
    completed_at: createdAt,
    total_requests: 1,
    successful_requests: 0,
    failed_requests: 0,
    duration_seconds: 1,
    error: null,
    scenarios: [
      {
        id: `${id}-s0`,
        instance_id: 'steady',
        routing_mode: 'direct',
        model_path: 'facebook/opt-125m',
        model_name: 'opt-125m',
        input_tokens: 8,
        output_tokens: 8,
        concurrency: 1,
        warmup_requests: 0,
        total_requests: 1,
        sla_threshold_ms: null,
        sla_ttft_ms: null,
        sla_tpot_ms: null,
        request_rate: null,
        status: 'completed',
        phase: 'done',
        started_at: createdAt,
        completed_at: createdAt,
        warmup_completed: 0,
        completed_requests: 0,
        successful_requests: 0,
        failed_requests: 0,
        prompt_tokens: 8,
        prompt_source: 'tokenize',
        prompt_note: null,
        error: null,
        metrics,
      },
    ],
    ...over,
  }
}
