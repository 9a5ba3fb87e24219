/**
 * proxy-server boots modelgate's gateway listener in its own process for the proxy benchmark and
 * the leak test: a real Host whose plugin serves the inference proxy (`createInference`) over a
 * fake GatewayApi with one active instance per `--upstream` port (named `m0`, `m1`, … and served
 * as `bench-model`). Prints one JSON line `{url, pid}` on stdout once listening; stops on SIGTERM.
 *
 * `--data-dir DIR` boots on an existing data dir (one test/perf/make-keys.ts filled with inference
 * keys: the host loads them as after a restart); it is removed when the server stops.
 *
 * With `--trace URL`, requests are traced and their spans exported to that OTLP endpoint
 * (test/perf/otlp-sink.ts in the benchmark): every one, or `--sample-ratio` of them.
 *
 *   bun test/perf/proxy-server.ts --upstream 9101 [--upstream 9102] [--api-key KEY] [--data-dir DIR]
 *   [--trace URL [--sample-ratio R]]
 */
import { FakeGateway, instance, startProxyHost } from '../wire/support.ts'

const args = process.argv.slice(2)
const upstreams: number[] = []
let apiKey: string | undefined
let dataDir: string | undefined
let otlpEndpoint: string | undefined
let sampleRatio = 1
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--upstream') upstreams.push(Number(args[++i]))
  else if (args[i] === '--api-key') apiKey = args[++i]
  else if (args[i] === '--data-dir') dataDir = args[++i]
  else if (args[i] === '--trace') otlpEndpoint = args[++i]
  else if (args[i] === '--sample-ratio') sampleRatio = Number(args[++i])
}
if (upstreams.length === 0) {
  console.error('usage: proxy-server.ts --upstream PORT [--upstream PORT] [--api-key KEY]')
  process.exit(2)
}

const api = new FakeGateway()
upstreams.forEach((port, n) => {
  api.add(instance(`m${n}`, port, { served_model_name: 'bench-model', model_path: 'bench/model' }))
})
const px = await startProxyHost(api, {
  ...(dataDir ? { dataDir } : {}),
  firstByteTimeoutMs: 600_000,
  connectTimeoutMs: 5_000,
  env: apiKey ? { INFERENCE_API_KEY: apiKey } : {},
  logSink: (line) => process.stderr.write(`${line}\n`),
  logLevel: 'error',
  captureEvents: false,
  ...(otlpEndpoint ? { otlpEndpoint, sampleRatio } : {}),
})
// Settled before anyone measures this process's memory.
Bun.gc(true)
process.stdout.write(`${JSON.stringify({ url: px.url, pid: process.pid })}\n`)

const stop = async () => {
  await px.stop()
  process.exit(0)
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
