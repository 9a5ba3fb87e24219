/**
 * hot-path (`npm run bench:hot-path`): the JavaScript cost of one proxied request on the wire
 * front, with the sockets taken out. A request's bytes go through the front's client connection
 * (parser, route, WireExchange), the upstream request is "written" to a pooled connection whose
 * socket only counts bytes, and the engine's reply is fed back; the reply then reaches the fake
 * client. What remains is exactly the per-request JS work (and the GC it causes) that the proxy
 * benchmark cannot separate from kernel time and machine noise.
 *
 * Two routes side by side, measured alternately in the same run (min over rounds, since the
 * machine only ever adds time):
 * - baseline: a route that forwards every request to a fixed origin (the front and exchange alone);
 * - gateway /v1: the gateway's real model route (model field, lease, metrics, proxy.request event).
 *
 *   bun test/perf/hot-path.ts [--requests N] [--rounds R]
 */
import { Registry } from 'prom-client'
import { createInference } from '../../plugins/gateway/inference.ts'
import { EventBus } from '../../src/host/bus.ts'
import { Logger } from '../../src/host/logger.ts'
import type { WireRoute } from '../../src/http/wire/server.ts'
import { WireFront } from '../../src/http/wire/server.ts'
import { Conn, originTarget, release } from '../../src/proxy/http1-pool.ts'
import { FakeGateway, instance } from '../proxy/support.ts'
import { numberArg } from './args.ts'

const REQUESTS = numberArg('--requests', 300_000)
const ROUNDS = numberArg('--rounds', 7)

const BASELINE_ORIGIN = 'http://127.0.0.1:9998'
const ENGINE_PORT = 9999
const REQUEST_BODY = '{"model":"bench-model","messages":[{"role":"user","content":"hi"}]}'
const REQUEST = Buffer.from(
  'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n' +
    `Content-Length: ${REQUEST_BODY.length}\r\nContent-Type: application/json\r\n\r\n${REQUEST_BODY}`,
)
const REPLY_BODY =
  '{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench-model",' +
  '"choices":[{"index":0,"message":{"role":"assistant","content":"A fixed answer from the stub engine."},' +
  '"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}'
const REPLY = Buffer.from(
  'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ndate: Sat, 21 Nov 2026 22:00:00 GMT\r\n' +
    `content-length: ${REPLY_BODY.length}\r\n\r\n${REPLY_BODY}`,
)

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
  once(): void
  counts(): { upstream: number; client: number }
}

/** path: a front with its own upstream origin (each origin's pool holds that path's one connection). */
function path(name: string, origin: string, routes: WireRoute[]): Path {
  const front = new WireFront({
    name,
    hostname: '127.0.0.1',
    port: 0,
    idleTimeoutSeconds: 60,
    routes,
    frameworkSocket: '/nonexistent',
    shapeOf: () => 'proxy',
    onRequest() {},
  })
  const h = handlers!
  let upstream = 0
  let client = 0
  const up = new Conn(originTarget(origin).key)
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
  release(up)
  h.open(socket)
  void front
  return {
    name,
    once() {
      // Bun hands each read over as a fresh Buffer: so does the driver.
      h.data(socket, Buffer.from(REQUEST))
      up.onData(Buffer.from(REPLY))
    },
    counts: () => ({ upstream, client }),
  }
}

const api = new FakeGateway()
api.add(instance('m0', ENGINE_PORT, { served_model_name: 'bench-model', model_path: 'bench/model' }))
const gateway = createInference({
  api,
  bus: new EventBus(),
  metrics: new Registry(),
  log: new Logger('error', 'bench', 'text', () => {}),
  config: { firstByteTimeoutMs: 600_000, connectTimeoutMs: 5_000 },
})
const paths = [
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
]
;(Bun as unknown as { listen: unknown }).listen = realListen

const best = new Map<string, number>()
for (const p of paths) for (let i = 0; i < 50_000; i++) p.once() // JIT warm-up
for (let r = 0; r < ROUNDS; r++) {
  for (const p of paths) {
    const t = performance.now()
    for (let i = 0; i < REQUESTS; i++) p.once()
    const us = ((performance.now() - t) * 1000) / REQUESTS
    best.set(p.name, Math.min(best.get(p.name) ?? Number.POSITIVE_INFINITY, us))
  }
}
for (const p of paths) {
  const c = p.counts()
  const expected = 50_000 + ROUNDS * REQUESTS
  if (c.upstream !== expected || c.client !== expected)
    throw new Error(
      `${p.name}: ${c.upstream} upstream writes and ${c.client} replies for ${expected} requests`,
    )
}
const base = best.get(paths[0]!.name)!
console.log(`\nJS cost per proxied request, no sockets (min of ${ROUNDS} rounds × ${REQUESTS})\n`)
for (const p of paths) {
  const us = best.get(p.name)!
  console.log(`  ${p.name.padEnd(28)} ${us.toFixed(2).padStart(6)} µs   ${(us / base).toFixed(2)}× baseline`)
}
