/**
 * router-server boots the router plugin in its own process for the proxy benchmark, with the same
 * contract as proxy-server.ts: routes `bench-model` to the first `--upstream` port, prints one JSON
 * line `{url, pid}` on stdout once listening (url: the router listener), stops on SIGTERM.
 *
 *   bun test/perf/router-server.ts --upstream 9101 [--model NAME]
 */
import { startRouterForBench } from './router-bench.ts'

const args = process.argv.slice(2)
let upstream = 0
let model = 'bench-model'
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--upstream' && upstream === 0) upstream = Number(args[++i])
  else if (args[i] === '--upstream') i++
  else if (args[i] === '--model') model = args[++i] ?? model
}
if (!upstream) {
  console.error('usage: router-server.ts --upstream PORT [--model NAME]')
  process.exit(2)
}

const rb = await startRouterForBench({
  upstreamPort: upstream,
  model,
  logSink: (line) => process.stderr.write(`${line}\n`),
})
process.stdout.write(`${JSON.stringify({ url: rb.url, pid: process.pid })}\n`)

const stop = async () => {
  await rb.stop()
  process.exit(0)
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
