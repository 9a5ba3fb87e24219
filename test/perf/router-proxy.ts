/**
 * router-proxy measures the router's /v1 path against the gateway's /v1 path in the same run
 * (`bun test/perf/router-proxy.ts`). One upstream engine (router-bench-engine.ts, answers at once)
 * serves three targets, each in its own process: the engine itself (direct), the gateway's
 * inference proxy (proxy-server.ts) and the router (router-server.ts, traffic statistics on).
 * A closed loop of `--concurrency` keep-alive clients drives each target for `--seconds`, for
 * non-streamed and streamed chat completions, `--reps` times in rotating order; the table shows
 * medians of throughput and latency, and the latency each proxy adds over direct.
 *
 *   bun test/perf/router-proxy.ts [--quick] [--concurrency 32] [--seconds 3] [--reps 3]
 *
 * Target: router throughput ≥ 95 % of the gateway's, and its added p50 latency ≤ 105 % of the
 * gateway's (or within 0.05 ms, below which the difference is timer noise).
 */
import { readFileSync } from 'node:fs'
import type { Subprocess } from 'bun'

const argv = process.argv.slice(2)
const quick = argv.includes('--quick')
const num = (name: string, fallback: number) => {
  const i = argv.indexOf(`--${name}`)
  return i >= 0 ? Number(argv[i + 1]) : fallback
}
const concurrency = num('concurrency', 32)
const seconds = num('seconds', quick ? 1.5 : 3)
const reps = num('reps', quick ? 1 : 3)
const here = (f: string) => new URL(f, import.meta.url).pathname

const children: Subprocess[] = []

async function firstLine(proc: Subprocess<'ignore', 'pipe', 'inherit'>): Promise<string> {
  const reader = proc.stdout.getReader()
  let text = ''
  const deadline = Date.now() + 15_000
  while (!text.includes('\n')) {
    if (Date.now() > deadline) throw new Error('child did not start')
    const { value, done } = await reader.read()
    if (done) throw new Error('child exited before it was ready')
    text += new TextDecoder().decode(value)
  }
  reader.releaseLock()
  return text.slice(0, text.indexOf('\n'))
}

async function spawn(file: string, args: string[]): Promise<{ line: string; pid: number }> {
  const proc = Bun.spawn([process.execPath, here(file), ...args], {
    stdin: 'ignore',
    stdout: 'pipe',
    stderr: 'inherit',
  })
  children.push(proc)
  return { line: await firstLine(proc), pid: proc.pid }
}

interface Figures {
  rps: number
  p50: number
  p99: number
  failed: number
  /** CPU time of the target's process per request, µs (the steadiest figure on a shared machine) */
  cpuUs: number
}

/** cpuMs reads a process's user + system CPU time from /proc (0 where there is no /proc). */
function cpuMs(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100
  } catch {
    return 0
  }
}

async function drive(
  url: string,
  pid: number,
  stream: boolean,
  ms: number,
  record: boolean,
): Promise<Figures> {
  const body = JSON.stringify({
    model: 'bench-model',
    messages: [{ role: 'user', content: 'hello' }],
    max_tokens: 16,
    stream,
  })
  const latencies: number[] = []
  let failed = 0
  const until = performance.now() + ms
  const worker = async () => {
    while (performance.now() < until) {
      const t0 = performance.now()
      try {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: 'Bearer bench' },
          body,
        })
        await res.arrayBuffer()
        if (res.status !== 200) failed++
      } catch {
        failed++
      }
      if (record) latencies.push(performance.now() - t0)
    }
  }
  const started = performance.now()
  const cpu0 = cpuMs(pid)
  await Promise.all(Array.from({ length: concurrency }, worker))
  const cpu = cpuMs(pid) - cpu0
  const elapsed = (performance.now() - started) / 1000
  latencies.sort((a, b) => a - b)
  const pct = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] ?? 0
  return {
    rps: latencies.length / elapsed,
    p50: pct(0.5),
    p99: pct(0.99),
    failed,
    cpuUs: latencies.length ? (cpu * 1000) / latencies.length : 0,
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

try {
  const engine = await spawn('router-bench-engine.ts', ['--port', '0', '--chunks', '16'])
  const enginePort = Number(/READY (\d+)/.exec(engine.line)?.[1])
  const gateway = await spawn('proxy-server.ts', ['--upstream', String(enginePort)])
  const routerSrv = await spawn('router-server.ts', ['--upstream', String(enginePort)])
  const urlOf = (line: string) => (JSON.parse(line) as { url: string }).url
  const targets: [string, string, number][] = [
    ['direct', `http://127.0.0.1:${enginePort}`, engine.pid],
    ['gateway', urlOf(gateway.line), gateway.pid],
    ['router', urlOf(routerSrv.line), routerSrv.pid],
  ]
  console.log(`concurrency ${concurrency}, ${seconds} s per run, ${reps} rep(s); medians`)
  let ok = true
  for (const stream of [false, true]) {
    const runs = new Map<string, Figures[]>(targets.map(([n]) => [n, []]))
    for (const [, url, pid] of targets) await drive(url, pid, stream, 300, false) // warm-up
    for (let rep = 0; rep < reps; rep++) {
      const order = targets.map((_, i) => targets[(i + rep) % targets.length]!)
      for (const [name, url, pid] of order)
        runs.get(name)!.push(await drive(url, pid, stream, seconds * 1000, true))
    }
    const med = (name: string, k: keyof Figures) => median(runs.get(name)!.map((f) => f[k]))
    const direct50 = med('direct', 'p50')
    console.log(`\n${stream ? 'streamed (16 chunks)' : 'non-streamed'} chat completions`)
    console.log('target    req/s     p50 ms   p99 ms   added p50 ms   CPU µs/req   failed')
    for (const [name] of targets) {
      const added = name === 'direct' ? '' : (med(name, 'p50') - direct50).toFixed(3).padStart(12)
      console.log(
        `${name.padEnd(8)} ${med(name, 'rps').toFixed(0).padStart(7)}  ${med(name, 'p50').toFixed(3).padStart(8)} ${med(name, 'p99').toFixed(3).padStart(8)}  ${added.padEnd(13)}  ${med(name, 'cpuUs').toFixed(1).padStart(10)}   ${med(name, 'failed')}`,
      )
    }
    const rpsRatio = med('router', 'rps') / med('gateway', 'rps')
    const addedGateway = med('gateway', 'p50') - direct50
    const addedRouter = med('router', 'p50') - direct50
    const latencyOk = addedRouter <= addedGateway * 1.05 || addedRouter - addedGateway <= 0.05
    const pass = rpsRatio >= 0.95 && latencyOk
    ok &&= pass
    console.log(
      `router/gateway throughput ${(rpsRatio * 100).toFixed(1)} %, added p50 ${addedRouter.toFixed(3)} vs ${addedGateway.toFixed(3)} ms, ` +
        `CPU per request ${((med('router', 'cpuUs') / med('gateway', 'cpuUs')) * 100).toFixed(1)} % → ${pass ? 'PASS' : 'FAIL'}`,
    )
  }
  process.exitCode = ok ? 0 : 1
} finally {
  for (const c of children) c.kill('SIGTERM')
}
