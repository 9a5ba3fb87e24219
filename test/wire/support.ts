import { Type as T } from '@sinclair/typebox'
import type { Server } from 'bun'
import type {
  GatewayApi,
  InstanceRecord,
  InstanceStatus,
  Lease,
  ProxyRequestEvent,
} from '../../plugins/gateway/api.ts'
import { InstanceBackend, type InstanceHandle } from '../../plugins/gateway/proxy/instance-backend.ts'
import { createInference } from '../../plugins/gateway/proxy/routes.ts'
import type { Backend, Readiness, SleepState } from '../../src/directory/backend.ts'
import type { GpuSnapshot } from '../../src/gpu/smi.ts'
import { definePlugin, type PluginDefinition } from '../../src/host/plugin.ts'
import { startHost, type TestHost } from '../support/host.ts'

/**
 * Test support for the inference proxy: a fake GatewayApi whose instances point at test upstreams,
 * a plugin mounting `createInference` on a real Host, and a scriptable upstream engine stub.
 */

export function instance(id: string, port: number, over: Partial<InstanceRecord> = {}): InstanceRecord {
  return {
    id,
    model_path: `org/${id}`,
    model_name: id,
    served_model_name: `${id}-served`,
    engine_kind: 'vllm',
    status: 'active',
    port,
    process_id: null,
    max_tokens: 4096,
    gpu_memory_utilization: 0.9,
    gpu_ids: [0],
    tensor_parallel_size: 1,
    sharedcache_enabled: false,
    enable_sleep_mode: false,
    sleep_level: null,
    slept_at: null,
    loaded_at: '2026-01-01T00:00:00.000Z',
    ready_at: '2026-01-01T00:00:10.000Z',
    extra_args: [],
    error: null,
    evictable: false,
    memory_metrics: null,
    memory_baseline_by_gpu: null,
    memory_gib_by_gpu: null,
    launch_command: '',
    ...over,
  }
}

/** FakeGateway resolves models like the real service and counts leases and releases. */
export class FakeGateway implements GatewayApi {
  readonly instances = new Map<string, InstanceRecord>()
  readonly inflight = new Map<string, number>()
  acquired = 0
  released = 0
  doubleReleases = 0

  add(rec: InstanceRecord): InstanceRecord {
    this.instances.set(rec.id, rec)
    return rec
  }
  setStatus(id: string, status: InstanceStatus): void {
    this.instances.get(id)!.status = status
  }
  list(): InstanceRecord[] {
    return [...this.instances.values()]
  }
  get(id: string): InstanceRecord | undefined {
    return this.instances.get(id)
  }
  /** Built once per port, as the gateway keeps each instance's base URL (the proxy benchmark runs on this fake). */
  private readonly urls = new Map<number, string>()
  engineBaseUrl(i: InstanceRecord): string {
    let url = this.urls.get(i.port)
    if (url === undefined) {
      url = `http://127.0.0.1:${i.port}`
      this.urls.set(i.port, url)
    }
    return url
  }
  moveInProgress(): boolean {
    return false
  }

  gpuReading(): Promise<GpuSnapshot> {
    return this.gpuSnapshot()
  }
  async gpuSnapshot(): Promise<GpuSnapshot> {
    return { available: false, reason: 'a fake gateway has no GPUs' }
  }

  /** A fake gateway has an empty catalogue and keeps none. */
  catalog() {
    return []
  }
  catalogEntry() {
    return undefined
  }
  saveCatalogEntry(): never {
    throw new Error('a fake gateway keeps no catalogue')
  }
  removeCatalogEntry(): never {
    throw new Error('a fake gateway keeps no catalogue')
  }

  inFlight(id: string): number {
    return this.inflight.get(id) ?? 0
  }
  totalInFlight(): number {
    let n = 0
    for (const v of this.inflight.values()) n += v
    return n
  }
  private lease(i: InstanceRecord): Lease {
    this.acquired++
    this.inflight.set(i.id, this.inFlight(i.id) + 1)
    let done = false
    return {
      instanceId: i.id,
      servedModelName: i.served_model_name,
      baseUrl: this.engineBaseUrl(i),
      contextTokens: i.max_tokens ?? null,
      release: () => {
        if (done) {
          this.doubleReleases++
          return
        }
        done = true
        this.released++
        this.inflight.set(i.id, this.inFlight(i.id) - 1)
      },
    }
  }
  /** Backends made once per instance, as the gateway keeps one per instance. */
  private readonly backendsById = new Map<string, InstanceBackend>()

  /** backends: the instances a model names, as the real service serves them to the directory. */
  backends(name: string): readonly Backend[] {
    let out: Backend[] | null = null
    for (const i of this.instances.values()) {
      if (i.id !== name && i.served_model_name !== name && i.model_path !== name) continue
      let b = this.backendsById.get(i.id)
      if (!b) {
        b = new InstanceBackend(new FakeHandle(this, i.id))
        this.backendsById.set(i.id, b)
      }
      if (out === null) out = []
      out.push(b)
    }
    return out ?? []
  }

  /** count: one lease taken (acquire) or given back (release), as the real lifecycle counts them. */
  count(id: string, delta: 1 | -1): void {
    if (delta === 1) this.acquired++
    else this.released++
    this.inflight.set(id, this.inFlight(id) + delta)
  }

  acquireByPort(port: number): Lease | null {
    const i = this.list().find((x) => x.port === port)
    return i ? this.lease(i) : null
  }
  load(): never {
    throw new Error('not in tests')
  }
  unload(): never {
    throw new Error('not in tests')
  }
  sleep(): never {
    throw new Error('not in tests')
  }
  wake(): never {
    throw new Error('not in tests')
  }
}

/**
 * FakeHandle: a fake instance as the gateway's instance backend reads it: readiness from its
 * status, leases counted on the fake, a wake that is the fake's (which refuses: no engine here),
 * and the Retry-After hints the fake's refusals used to carry (30 s asleep, 5 s loading).
 */
class FakeHandle implements InstanceHandle {
  constructor(
    private readonly gw: FakeGateway,
    readonly id: string,
  ) {}

  private get rec(): InstanceRecord {
    return this.gw.instances.get(this.id)!
  }

  get servedModelName(): string {
    return this.rec.served_model_name
  }

  get modelPath(): string {
    return this.rec.model_path
  }

  get baseUrl(): string {
    return this.gw.engineBaseUrl(this.rec)
  }

  readiness(): Readiness {
    switch (this.rec.status) {
      case 'active':
        return 'ready'
      case 'sleeping':
        return 'asleep'
      case 'starting':
        return 'starting'
      default:
        return 'unavailable'
    }
  }

  inFlight(): number {
    return this.gw.inFlight(this.id)
  }

  acquire(): void {
    this.gw.count(this.id, 1)
  }

  release(): void {
    this.gw.count(this.id, -1)
  }

  async wake(): Promise<void> {
    await this.gw.wake()
  }

  retryAfterSeconds(): number | null {
    return this.rec.status === 'sleeping' ? 30 : 5
  }

  sleepState(): SleepState | null {
    const r = this.rec
    if (r.status === 'active') return { status: 'active', since: null, level: null, operation: null }
    if (r.status !== 'sleeping') return null
    return {
      status: 'sleeping',
      since: r.slept_at ? Date.parse(r.slept_at) : null,
      level: null,
      operation: null,
    }
  }

  sleepable(): boolean {
    return this.rec.enable_sleep_mode
  }

  sleep(): Promise<void> {
    return Promise.reject(new Error('not in tests'))
  }

  async health() {
    return { ok: false as const, error: 'a fake instance has no engine' }
  }

  address() {
    return { host: '127.0.0.1', port: this.rec.port }
  }

  created(): number {
    return Math.floor(Date.parse(this.rec.ready_at ?? this.rec.loaded_at) / 1000)
  }
}

export interface ProxyHostOptions {
  firstByteTimeoutMs?: number
  connectTimeoutMs?: number
  idleTimeoutSeconds?: number
  env?: Record<string, string | undefined>
  /** logSink receives log lines (default: kept in `logs`). */
  logSink?: (line: string) => void
  logLevel?: 'debug' | 'info' | 'warn' | 'error'
  /** captureEvents: keep every proxy.request event in `events` (default true; off for benchmarks). */
  captureEvents?: boolean
  /** dataDir: the host's data dir (default: a fresh temp dir), e.g. one holding keys made beforehand. */
  dataDir?: string
  /** otlpEndpoint: `telemetry.otlp_endpoint` (request spans exported there). */
  otlpEndpoint?: string
  /** sampleRatio: `telemetry.sample_ratio` with an otlpEndpoint (default 1: every request). */
  sampleRatio?: number
}

export interface ProxyHost extends TestHost {
  events: ProxyRequestEvent[]
}

/** startProxyHost boots a real Host (the one booter) whose only plugin serves `createInference` over `api`. */
export async function startProxyHost(api: GatewayApi, o: ProxyHostOptions = {}): Promise<ProxyHost> {
  const idle = o.idleTimeoutSeconds ?? 120
  const plugin = definePlugin({
    id: 'gateway',
    description: 'inference proxy under test',
    config: T.Object({}, { additionalProperties: true }),
    setup(ctx) {
      const inf = createInference({
        api,
        directory: ctx.directory,
        bus: ctx.bus,
        metrics: ctx.metrics,
        log: ctx.log,
        config: {
          firstByteTimeoutMs: o.firstByteTimeoutMs ?? 10_000,
          connectTimeoutMs: o.connectTimeoutMs ?? 1_000,
          idleTimeoutSeconds: idle,
        },
      })
      return { rawRoutes: inf.rawRoutes, routes: inf.routes, api }
    },
  }) as unknown as PluginDefinition
  const telemetry = o.otlpEndpoint
    ? `telemetry: { otlp_endpoint: '${o.otlpEndpoint}', sample_ratio: ${o.sampleRatio ?? 1} }\n`
    : ''
  const th = await startHost(`${telemetry}plugins:\n  gateway: {}\n`, [plugin], o.env ?? {}, o.dataDir, {
    server: { idle_timeout_seconds: idle },
    logLevel: o.logLevel ?? 'warn',
    ...(o.logSink ? { logSink: o.logSink } : {}),
  })
  const events: ProxyRequestEvent[] = []
  if (o.captureEvents !== false) th.host.bus.on('proxy.request', (e) => events.push(e))
  return { ...th, events }
}

export interface SeenRequest {
  method: string
  path: string
  query: string
  headers: Record<string, string>
  body: Uint8Array
}

export type StubHandler = (
  req: Request,
  seen: SeenRequest,
  server: Server<unknown>,
) => Response | Promise<Response>

/** Stub is an upstream engine whose behaviour each test scripts; it records what it received. */
export interface Stub {
  port: number
  url: string
  seen: SeenRequest[]
  aborts: number
  handler: StubHandler
  stop(): void
}

export const encoder = new TextEncoder()

export function startStub(handler: StubHandler = chatHandler()): Stub {
  const stub: Stub = {
    port: 0,
    url: '',
    seen: [],
    aborts: 0,
    handler,
    stop: () => server.stop(true),
  }
  const server = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    idleTimeout: 0,
    async fetch(req, srv) {
      const url = req.url
      const start = url.indexOf('/', 8)
      const q = url.indexOf('?', start)
      const body = req.method === 'GET' || req.method === 'HEAD' ? new Uint8Array() : await req.bytes()
      const seen: SeenRequest = {
        method: req.method,
        path: q < 0 ? url.slice(start) : url.slice(start, q),
        query: q < 0 ? '' : url.slice(q),
        headers: req.headers.toJSON(),
        body,
      }
      stub.seen.push(seen)
      req.signal.addEventListener('abort', () => {
        stub.aborts++
      })
      return stub.handler(req, seen, srv)
    },
  })
  stub.port = server.port!
  stub.url = `http://127.0.0.1:${server.port}`
  return stub
}

export const CHAT_REPLY = {
  id: 'chatcmpl-stub',
  object: 'chat.completion',
  created: 1_700_000_000,
  model: 'stub',
  choices: [
    { index: 0, message: { role: 'assistant', content: 'Hello from the stub.' }, finish_reason: 'stop' },
  ],
  usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 },
}

export function sseChunk(i: number, content: string): string {
  const chunk = {
    id: 'chatcmpl-stub',
    object: 'chat.completion.chunk',
    created: 1_700_000_000,
    model: 'stub',
    choices: [
      { index: 0, delta: i === 0 ? { role: 'assistant', content } : { content }, finish_reason: null },
    ],
  }
  return `data: ${JSON.stringify(chunk)}\n\n`
}

/** streamFrames: the exact frames a stub stream of `n` tokens sends (the last one is [DONE]). */
export function streamFrames(n: number): string[] {
  const frames: string[] = []
  for (let i = 0; i < n; i++) frames.push(sseChunk(i, `tok${i} `))
  frames.push('data: [DONE]\n\n')
  return frames
}

/** sseResponse sends `frames` one by one, `gapMs` apart, as an engine streams tokens. */
export function sseResponse(frames: string[], gapMs: number, onPull?: () => void | Promise<void>): Response {
  let i = 0
  return new Response(
    new ReadableStream<Uint8Array>(
      {
        async pull(c) {
          await onPull?.()
          if (i > 0 && gapMs > 0) await Bun.sleep(gapMs)
          if (i >= frames.length) return c.close()
          c.enqueue(encoder.encode(frames[i++]!))
        },
      },
      { highWaterMark: 0 },
    ),
    { headers: { 'content-type': 'text/event-stream; charset=utf-8', 'x-engine': 'stub' } },
  )
}

/** chatHandler answers like an engine: JSON, or a stream of `tokens` frames when `stream: true`. */
export function chatHandler(tokens = 8, gapMs = 10): StubHandler {
  return (_req, seen) => {
    let stream = false
    try {
      stream = JSON.parse(new TextDecoder().decode(seen.body)).stream === true
    } catch {}
    if (stream) return sseResponse(streamFrames(tokens), gapMs)
    return Response.json(CHAT_REPLY, { headers: { 'x-engine': 'stub' } })
  }
}

export async function postJson(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Response> {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  })
}

export async function errorOf(res: Response): Promise<Record<string, unknown>> {
  return ((await res.json()) as { error: Record<string, unknown> }).error
}

/** readChunks reads a body chunk by chunk, noting when each arrived. */
export async function readChunks(res: Response): Promise<{ chunks: string[]; at: number[] }> {
  const decoder = new TextDecoder()
  const chunks: string[] = []
  const at: number[] = []
  for await (const c of res.body!) {
    chunks.push(decoder.decode(c))
    at.push(performance.now())
  }
  return { chunks, at }
}

/**
 * Lockstep: an engine stream whose next frame does not exist until the client has received the
 * one before it (the test calls `received()` for each frame it reads, as readFrames does). A proxy
 * that held frames back (buffered the reply, or waited for more before writing) would leave the
 * client waiting for a frame the engine cannot send yet: readFrames' deadline ends the test. So
 * delivery frame by frame is shown without timing anything, and a busy machine cannot coalesce two
 * frames into one read, since the second is not sent before the first is read.
 */
export interface Lockstep {
  /** response: the engine's reply (a new stream over the same frames each time). */
  response(init?: { status?: number; headers?: Record<string, string> }): Response
  /** received: the client has the latest frame; the engine may send the next. */
  received(): void
  /** sent: how many frames the engine has sent so far. */
  readonly sent: number
}

export function lockstep(frames: string[]): Lockstep {
  let gate = Promise.withResolvers<void>()
  let sent = 0
  return {
    get sent() {
      return sent
    },
    received() {
      gate.resolve()
    },
    response(init = {}) {
      let i = 0
      sent = 0
      gate = Promise.withResolvers<void>()
      return new Response(
        new ReadableStream<Uint8Array>(
          {
            async pull(c) {
              if (i > 0) {
                await gate.promise
                gate = Promise.withResolvers<void>()
              }
              if (i >= frames.length) return c.close()
              c.enqueue(encoder.encode(frames[i++]!))
              sent = i
            },
          },
          { highWaterMark: 0 },
        ),
        {
          status: init.status ?? 200,
          headers: {
            'content-type': 'text/event-stream; charset=utf-8',
            'x-engine': 'stub',
            ...init.headers,
          },
        },
      )
    },
  }
}

/**
 * readFrames reads an SSE body and splits it into frames ("data: …\n\n", the separator kept), in
 * the order received; after each complete frame it calls `onFrame` (with the frame and its index).
 * Frames are found in the bytes, whatever the network did to them (split or joined). A read that
 * brings nothing within `deadlineMs` fails, naming the frames had so far: a deadline, not a figure.
 */
export async function readFrames(
  res: Response,
  onFrame: (frame: string, i: number) => void = () => {},
  deadlineMs = 10_000,
): Promise<{ frames: string[]; text: string }> {
  const decoder = new TextDecoder()
  const reader = res.body!.getReader()
  const frames: string[] = []
  let text = ''
  let rest = ''
  for (;;) {
    let timer: Timer | undefined
    const next = await Promise.race([
      reader.read(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () =>
            reject(
              new Error(
                `no bytes within ${deadlineMs} ms after ${frames.length} frame(s): ${JSON.stringify(frames)}`,
              ),
            ),
          deadlineMs,
        )
      }),
    ]).finally(() => clearTimeout(timer))
    if (next.done) break
    const s = decoder.decode(next.value, { stream: true })
    text += s
    rest += s
    for (let end = rest.indexOf('\n\n'); end >= 0; end = rest.indexOf('\n\n')) {
      const frame = rest.slice(0, end + 2)
      rest = rest.slice(end + 2)
      frames.push(frame)
      onFrame(frame, frames.length - 1)
    }
  }
  if (rest !== '') frames.push(rest) // an incomplete last frame, kept so that tests see it
  return { frames, text }
}
