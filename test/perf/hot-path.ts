/**
 * hot-path (`npm run bench:hot-path`): the JavaScript cost of one proxied request on the wire
 * front, with the sockets taken out. A request's bytes go through the front's client connection
 * (parser, route, WireExchange), the upstream request is "written" to a pooled connection whose
 * socket only counts bytes, and the engine's reply is fed back; the reply then reaches the fake
 * client. What remains is exactly the per-request JS work (and the GC it causes) that the proxy
 * benchmark cannot separate from kernel time and machine noise.
 *
 * Three paths side by side, measured alternately in the same run (min over rounds, since the
 * machine only ever adds time):
 * - baseline: a route that forwards every request to a fixed origin (the front and exchange alone);
 * - gateway /v1: the gateway's real model route (model field, lease, metrics, proxy.request event);
 * - gateway /v1 stream: the same route answered by an engine's chunked SSE stream of CHUNKS reads
 *   (one event per read, as engines flush them), reported per chunk (the request's own cost spread
 *   over its chunks): the streaming hot path.
 *
 * With `--traced`, two more paths: the gateway's /v1, plain and streamed, with every request traced
 * (sample_ratio 1.0), its spans exported to an OTLP collector in another process; each round waits
 * for its export, so encoding and sending the spans are in the figure. As those rounds also wait
 * on the collector, every path is reported by CPU time too (this process's, user and system): for
 * the others it is their wall time, for the traced ones the JS cost without the waits.
 *
 *   bun test/perf/hot-path.ts [--requests N] [--rounds R] [--traced]
 */
import { Registry } from 'prom-client'
import { createInference } from '../../plugins/gateway/proxy/routes.ts'
import { ModelDirectory } from '../../src/directory/directory.ts'
import { EventBus } from '../../src/host/bus.ts'
import { Logger } from '../../src/host/logger.ts'
import { Telemetry } from '../../src/host/telemetry/telemetry.ts'
import { Conn, upstreams } from '../../src/wire/pool.ts'
import type { WireRoute } from '../../src/wire/route.ts'
import { WireFront } from '../../src/wire/server.ts'
import { FakeGateway, instance, sseChunk } from '../wire/support.ts'
import { numberArg } from './args.ts'

const REQUESTS = numberArg('--requests', 300_000)
const ROUNDS = numberArg('--rounds', 7)
const TRACED = process.argv.includes('--traced')

const BASELINE_ORIGIN = 'http://127.0.0.1:9998'
const ENGINE_PORT = 9999
const REQUEST_BODY = '{"model":"bench-model","messages":[{"role":"user","content":"hi"}]}'
const requestOf = (body: string) =>
  Buffer.from(
    'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n' +
      `Content-Length: ${body.length}\r\nContent-Type: application/json\r\n\r\n${body}`,
  )
const REQUEST = requestOf(REQUEST_BODY)
const STREAM_REQUEST = requestOf(
  '{"model":"stream-model","stream":true,"messages":[{"role":"user","content":"hi"}]}',
)
const REPLY_BODY =
  '{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench-model",' +
  '"choices":[{"index":0,"message":{"role":"assistant","content":"A fixed answer from the stub engine."},' +
  '"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}'
const REPLY = Buffer.from(
  'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ndate: Sat, 21 Nov 2026 22:00:00 GMT\r\n' +
    `content-length: ${REPLY_BODY.length}\r\n\r\n${REPLY_BODY}`,
)

/** The streamed reply: head, CHUNKS chunked SSE events (one read each), [DONE] and the last chunk. */
const CHUNKS = 64
const chunked = (s: string) => `${Buffer.byteLength(s).toString(16)}\r\n${s}\r\n`
const STREAM_HEAD = Buffer.from(
  'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ndate: Sat, 21 Nov 2026 22:00:00 GMT\r\n' +
    'transfer-encoding: chunked\r\n\r\n',
)
const STREAM_READS = Array.from({ length: CHUNKS }, (_, i) => Buffer.from(chunked(sseChunk(i, `tok${i} `))))
const STREAM_END = Buffer.from(`${chunked('data: [DONE]\n\n')}0\r\n\r\n`)

// The front's listener is replaced by one that hands over its socket handlers, so the driver can
// play the client connection; the upstream is a pooled connection with a counting socket.
type Handlers = { open(s: unknown): void; data(s: unknown, d: Buffer): void }
let handlers: Handlers | null = null
const realListen = Bun.listen
;(Bun as unknown as { listen: unknown }).listen = (o: { socket: Handlers }) => {
  handlers = o.socket
  return { hostname: '127.0.0.1', port: 0, stop() {} }
}

interface Path {
  name: string
  /** Units one call of once() is reported in (a request, or each streamed chunk). */
  per: number
  /** Client writes one call of once() makes. */
  writes: number
  once(): void
  counts(): { upstream: number; client: number }
  /** telemetry: the front's, when its requests are traced (its export is waited for in each round). */
  telemetry?: Telemetry
  /**
   * fresh: its pooled connection counts as just used. A traced round waits for its exports, so the
   * other paths' connections can sit longer than the pool reuses an idle one: the pool would drop it.
   */
  fresh(): void
}

/** path: a front with its own upstream origin (each origin's pool holds that path's one connection). */
function path(
  name: string,
  origin: string,
  routes: WireRoute[],
  stream = false,
  traced?: { telemetry: Telemetry; model: string },
): Path {
  const telemetry = traced?.telemetry
  const request = traced
    ? requestOf(`{"model":"${traced.model}"${stream ? ',"stream":true' : ''},"messages":[]}`)
    : stream
      ? STREAM_REQUEST
      : REQUEST
  const front = new WireFront({
    name,
    hostname: '127.0.0.1',
    port: 0,
    idleTimeoutSeconds: 60,
    routes,
    frameworkSocket: '/nonexistent',
    shapeOf: () => 'proxy',
    onRequest() {},
    ...(telemetry ? { telemetry } : {}),
  })
  const h = handlers!
  let upstream = 0
  let client = 0
  const up = new Conn(upstreams.origin(origin))
  up.socket = {
    write: (d: Uint8Array) => {
      upstream++
      return d.length
    },
    terminate() {},
    pause() {},
    resume() {},
  } as unknown as Conn['socket']
  const socket = {
    data: null,
    write: (d: Uint8Array) => {
      client++
      return d.length
    },
    timeout() {},
    end() {},
    pause() {},
    resume() {},
    terminate() {},
  }
  up.release()
  h.open(socket)
  void front
  return {
    name,
    per: stream ? CHUNKS : 1,
    // A stream: the head, then each read relayed as it came (the last one carries [DONE] and the end).
    writes: stream ? CHUNKS + 2 : 1,
    once() {
      // Bun hands each read over as a fresh Buffer: so does the driver.
      h.data(socket, Buffer.from(request))
      if (!stream) {
        up.onData(Buffer.from(REPLY))
        return
      }
      up.onData(Buffer.from(STREAM_HEAD))
      for (const read of STREAM_READS) up.onData(Buffer.from(read))
      up.onData(Buffer.from(STREAM_END))
    },
    counts: () => ({ upstream, client }),
    fresh: () => {
      up.idleSince = performance.now()
    },
    ...(telemetry ? { telemetry } : {}),
  }
}

/**
 * The collector of the traced paths, in a process of its own (test/perf/otlp-sink.ts: it counts the
 * spans it is sent and decodes nothing), so that the CPU time measured here is this process's own.
 */
const sink = TRACED
  ? Bun.spawn([process.execPath, `${import.meta.dir}/otlp-sink.ts`], { stdout: 'pipe', stderr: 'inherit' })
  : null
const collector = sink
  ? (JSON.parse(
      new TextDecoder().decode((await (sink.stdout as ReadableStream<Uint8Array>).getReader().read()).value),
    ) as { url: string })
  : null
const telemetry = collector
  ? await Telemetry.start(
      {
        otlp_endpoint: collector.url,
        headers: {},
        service_name: 'hot-path',
        sample_ratio: Number(process.env.H32_RATIO ?? 1),
        export_timeout_ms: 10_000,
        engine_otlp_traces_endpoint: '',
      },
      { version: 'bench', log: new Logger('error', 'bench', 'text', () => {}) },
    )
  : undefined

const api = new FakeGateway()
api.add(instance('m0', ENGINE_PORT, { served_model_name: 'bench-model', model_path: 'bench/model' }))
api.add(instance('m1', ENGINE_PORT + 1, { served_model_name: 'stream-model', model_path: 'bench/stream' }))
const bus = new EventBus()
const log = new Logger('error', 'bench', 'text', () => {})
const registry = new Registry()
const gateway = createInference({
  api,
  directory: new ModelDirectory(bus, log, registry),
  bus,
  metrics: registry,
  log,
  config: { firstByteTimeoutMs: 600_000, connectTimeoutMs: 5_000 },
})
const paths: Path[] = process.env.H32_ONLY
  ? []
  : [
      path('baseline (fixed forward)', BASELINE_ORIGIN, [
        {
          match: () => true,
          wire: (req) => ({
            forward: {
              origin: BASELINE_ORIGIN,
              target: '/v1/chat/completions',
              body: req.body,
              firstByteTimeoutMs: 600_000,
              connectTimeoutMs: 5_000,
              onEnd() {},
            },
          }),
        },
      ]),
      path('gateway /v1', `http://127.0.0.1:${ENGINE_PORT}`, gateway.rawRoutes),
      path('gateway /v1 stream, per chunk', `http://127.0.0.1:${ENGINE_PORT + 1}`, gateway.rawRoutes, true),
    ]
if (telemetry) {
  // Their own engines (and pooled connections), so each path keeps its one upstream connection.
  api.add(instance('m2', ENGINE_PORT + 2, { served_model_name: 'traced-model', model_path: 'bench/traced' }))
  api.add(
    instance('m3', ENGINE_PORT + 3, { served_model_name: 'traced-stream', model_path: 'bench/tstream' }),
  )
  paths.push(
    path('gateway /v1 traced', `http://127.0.0.1:${ENGINE_PORT + 2}`, gateway.rawRoutes, false, {
      telemetry,
      model: 'traced-model',
    }),
    path(
      'gateway /v1 stream traced, per chunk',
      `http://127.0.0.1:${ENGINE_PORT + 3}`,
      gateway.rawRoutes,
      true,
      {
        telemetry,
        model: 'traced-stream',
      },
    ),
  )
}
;(Bun as unknown as { listen: unknown }).listen = realListen

/** calls: once() calls per round, so that every path handles about REQUESTS units (requests or chunks). */
const calls = (p: Path) => Math.ceil(REQUESTS / p.per)
const WARMUP = 50_000
const best = new Map<string, number>()
const bestCpu = new Map<string, number>()
/** A traced path waits for its export after each slice (fewer spans than the tracer queues at most). */
const SLICE = 1000
async function run(p: Path, n: number): Promise<void> {
  p.fresh()
  if (!p.telemetry) {
    for (let i = 0; i < n; i++) p.once()
    return
  }
  for (let done = 0; done < n; ) {
    const until = Math.min(n, done + SLICE)
    for (; done < until; done++) p.once()
    await p.telemetry.flush()
  }
}
for (const p of paths) await run(p, Math.ceil(WARMUP / p.per)) // JIT warm-up
for (let r = 0; r < ROUNDS; r++) {
  for (const p of paths) {
    const n = calls(p)
    const t = performance.now()
    const cpu = process.cpuUsage()
    await run(p, n)
    const us = ((performance.now() - t) * 1000) / (n * p.per)
    const used = process.cpuUsage(cpu)
    const cpuUs = (used.user + used.system) / (n * p.per)
    bestCpu.set(p.name, Math.min(bestCpu.get(p.name) ?? Number.POSITIVE_INFINITY, cpuUs))
    best.set(p.name, Math.min(best.get(p.name) ?? Number.POSITIVE_INFINITY, us))
  }
}
for (const p of paths) {
  const c = p.counts()
  const expected = Math.ceil(WARMUP / p.per) + ROUNDS * calls(p)
  if (c.upstream !== expected || c.client !== expected * p.writes)
    throw new Error(
      `${p.name}: ${c.upstream} upstream writes and ${c.client} client writes for ${expected} requests`,
    )
}
const base = best.get(paths[0]!.name)!
console.log(
  `\nJS cost per proxied request or streamed chunk, no sockets (min of ${ROUNDS} rounds × ~${REQUESTS})\n`,
)
for (const p of paths) {
  const us = best.get(p.name)!
  const cpu = bestCpu.get(p.name)!
  console.log(
    `  ${p.name.padEnd(36)} ${us.toFixed(2).padStart(6)} µs   ${(us / base).toFixed(2)}× baseline` +
      `   CPU ${cpu.toFixed(2).padStart(6)} µs`,
  )
}
if (telemetry) {
  const traced = paths
    .filter((p) => p.telemetry)
    .reduce((n, p) => n + Math.ceil(WARMUP / p.per) + ROUNDS * calls(p), 0)
  await telemetry.shutdown()
  const count = (await (await fetch(`${collector!.url}/count`)).json()) as { spans: number }
  console.log(`\n  the collector received ${count.spans} spans for ${traced} traced requests`)
  sink?.kill()
}
