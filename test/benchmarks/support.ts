import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Type as T } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import benchmarks from '../../plugins/benchmarks/index.ts'
import { ScenarioRecorder } from '../../plugins/benchmarks/metrics.ts'
import type { BenchmarkRun } from '../../plugins/benchmarks/model.ts'
import type { GatewayApi, InstanceRecord } from '../../plugins/gateway/api.ts'
import { knownPlugins } from '../../src/config/file.ts'
import { loadConfig } from '../../src/config/load.ts'
import { Host } from '../../src/host/host.ts'
import { Logger } from '../../src/host/logger.ts'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import { type EngineProc, spawnEngine, tempSimDir, waitHealthy } from '../sim/helpers.ts'

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
    memory_metrics: null,
    memory_baseline_by_gpu: null,
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

export function fakeGateway(list: InstanceRecord[] = []): FakeGateway {
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
    acquire: unsupported,
    acquireByPort: () => null,
    inFlight: () => 0,
    moveInProgress: () => false,
  }
  const plugin = definePlugin({
    id: 'gateway',
    description: 'fake gateway for benchmark tests',
    config: T.Object({}, { additionalProperties: false }),
    setup: () => ({
      api,
      routes: new Elysia().post('/v1/completions', async ({ request }) => {
        const body = (await request.json()) as { model: string }
        const target = instances.get(body.model)
        if (!target) return Response.json({ error: { message: 'unknown model' } }, { status: 400 })
        const auth = request.headers.get('authorization') ?? '(none)'
        proxied.set(auth, (proxied.get(auth) ?? 0) + 1)
        const upstream = await fetch(`http://127.0.0.1:${target.port}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ ...body, model: target.served_model_name }),
          signal: request.signal,
        })
        return new Response(upstream.body, { status: upstream.status, headers: upstream.headers })
      }),
    }),
  }) as unknown as PluginDefinition
  return { plugin, instances, proxied }
}

export interface BenchHost {
  host: Host
  url: string
  dataDir: string
  logs: string[]
  stop(): Promise<void>
  /** stopKeep shuts down but keeps the data dir (for restart tests). */
  stopKeep(): Promise<void>
}

export function tempDataDir(): string {
  return mkdtempSync(join(tmpdir(), 'modelgate-bench-test-'))
}

export async function bootHost(
  gateway: FakeGateway,
  opts: { dataDir?: string; env?: Record<string, string>; benchmarksYaml?: string } = {},
): Promise<BenchHost> {
  const dataDir = opts.dataDir ?? tempDataDir()
  const yaml =
    `data_dir: ${dataDir}\nserver: { host: 127.0.0.1, port: 0 }\nlog: { level: warn }\n` +
    `plugins:\n  gateway: {}\n  benchmarks: ${opts.benchmarksYaml ?? '{ progress_interval_ms: 0 }'}\n`
  const defs = [gateway.plugin, benchmarks as unknown as PluginDefinition]
  const config = loadConfig(yaml, opts.env ?? {}, knownPlugins(defs))
  const logs: string[] = []
  const logger = new Logger('warn', 'test', 'text', (l) => logs.push(l))
  const host = new Host({
    config,
    definitions: defs,
    version: '0.0.0-test',
    selfCommand: [process.execPath],
    logger,
  })
  await host.boot()
  return {
    host,
    url: host.urls.main!,
    dataDir,
    logs,
    stopKeep: () => host.shutdown('test'),
    async stop() {
      await host.shutdown('test')
      rmSync(dataDir, { recursive: true, force: true })
    },
  }
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

/** waitFor polls the run until `done(run)` or the deadline. */
export async function waitRun(
  base: string,
  id: string,
  done: (r: BenchmarkRun) => boolean = (r) => ['completed', 'failed', 'cancelled'].includes(r.status),
  ms = 20_000,
): Promise<BenchmarkRun> {
  const deadline = Date.now() + ms
  for (;;) {
    const run = await getRun(base, id)
    if (done(run)) return run
    if (Date.now() > deadline) throw new Error(`run ${id} not done in ${ms} ms: ${JSON.stringify(run)}`)
    await Bun.sleep(25)
  }
}

export interface SseMessage {
  event: string
  data: Record<string, unknown>
}

/** readEvents reads an SSE stream until it closes (or the deadline) and returns its messages. */
export async function readEvents(url: string, ms = 20_000): Promise<SseMessage[]> {
  const res = await fetch(url, { signal: AbortSignal.timeout(ms) })
  if (res.status !== 200) throw new Error(`events: HTTP ${res.status}`)
  const text = await res.text()
  return text
    .split('\n\n')
    .map((frame) => {
      const event = /^event: (.+)$/m.exec(frame)?.[1]
      const data = /^data: (.+)$/m.exec(frame)?.[1]
      return event && data ? { event, data: JSON.parse(data) as Record<string, unknown> } : null
    })
    .filter((m): m is SseMessage => m !== null)
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
