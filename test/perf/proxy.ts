/**
 * Proxy benchmark (`npm run bench:proxy`): modelgate's inference proxy against nginx as a reverse
 * proxy, same machine, same run, same upstream stub (test/perf/proxy-stub.ts).
 *
 * Columns: the stub directly (baseline), modelgate `/v1/chat/completions`, the same with 1,000
 * inference keys and a key with limits on every request, modelgate `/api/direct/:port/…`, the router,
 * nginx (skipped with a note when not installed), and a blind Bun pipe (test/perf/proxy-pipe.ts: the floor of Bun's socket layer, with no proxy logic). Each server
 * runs in its own process, and so do the load generators (wrk when installed, else
 * test/perf/proxy-load.ts; the stream client test/perf/proxy-stream-client.ts), so client load and
 * proxy never share an event loop. Everything listens on 127.0.0.1; every loop is bounded.
 *
 * Shared machines drift by ±20% within a minute, more than the differences measured here, so every
 * measurement runs in ROUNDS rounds (5; `--rounds N`; `--quick`: 1 round), targets in a rotated order
 * each round. The table shows medians over rounds; each ratio is the median of per-round ratios,
 * printed with the rounds' values so the spread is visible. A full run takes about 4 minutes.
 *
 * Measures: non-streaming requests/s and added latency (p50/p99 minus the stub's) at concurrency 1
 * and 32; per-chunk pass-through delay p50/p99/max at 256 and 1024 concurrent streams (64 chunks
 * 20 ms apart), streams completed, errors; modelgate's RSS idle and peak at 1024 streams; the keys'
 * cost (throughput and added p50 against keys off, the same run) and their memory (the proxy idle
 * with 100,000 keys against none).
 *
 * Two more columns on request, each its own modelgate process on the same stub, measured in the
 * same rounds as `modelgate /v1`:
 * - `--traced`: requests traced (every one, or `--sample-ratio R` of them), their spans exported
 *   to a local OTLP collector in its own process (test/perf/otlp-sink.ts); the ratios traced/off
 *   follow the table.
 * - `--baseline DIR`: the proxy server and the router of another tree (a worktree of the commit
 *   before a change), tracing off like the first; the ratios this tree/baseline follow the table,
 *   for the gateway's /v1 and for the router.
 *
 * - `--apis`: `/v1/responses` and `/v1/messages` on the keyed proxy (the stub answers each in its
 *   API's shape, so each API's usage is read from its own bytes); the ratios to the keyed
 *   `/v1/chat/completions` column follow the table.
 *
 *   bun test/perf/proxy.ts [--quick] [--rounds N] [--traced [--sample-ratio R]] [--baseline DIR] [--apis]
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { numberArg } from './args.ts'
import { cpuMs, headerArgs, proxyLoad, rssMb, spawnJson, stopAll } from './procs.ts'

const HERE = import.meta.dir
const BUN = process.execPath
const QUICK = process.argv.includes('--quick')
const NON_STREAM_SECONDS = 2
/** ROUNDS: how many times every measurement runs (medians are reported); --quick runs one. */
const ROUNDS = Math.max(1, numberArg('--rounds', QUICK ? 1 : 5) || 1)
const TRACED = process.argv.includes('--traced')
const BASELINE = process.argv.includes('--baseline')
  ? process.argv[process.argv.indexOf('--baseline') + 1]
  : null
/** SAMPLE_RATIO: the traced column's telemetry.sample_ratio. */
const SAMPLE_RATIO = process.argv.includes('--sample-ratio') ? numberArg('--sample-ratio', 1) : 1
const TRACED_NAME = SAMPLE_RATIO === 1 ? 'modelgate /v1 (traced)' : `modelgate /v1 (traced ${SAMPLE_RATIO})`
const BASELINE_NAME = 'modelgate /v1 (baseline)'
/** `--apis`: the Responses and Messages routes on the keyed proxy, each against its chat column. */
const APIS = process.argv.includes('--apis')
const RESPONSES_NAME = 'modelgate /v1/responses (keys)'
const MESSAGES_NAME = 'modelgate /v1/messages (keys)'
const ROUTER_BASELINE_NAME = 'router /v1 (baseline)'
const STREAM_LEVELS = [256, 1024]
const CONCURRENCY = [1, 32]
const tmp = mkdtempSync(join(tmpdir(), 'modelgate-bench-proxy-'))
const children: Subprocess[] = []
/** launch: a server of this benchmark, stopped with the others at the end. */
const launch = (argv: string[]) => spawnJson(argv, children)

interface Target {
  name: string
  url: string
  /** pid whose CPU is charged to this target (the proxy process), if measured. */
  pid?: number
  /** Headers every request sends (an inference key). */
  headers?: Record<string, string>
}

interface NonStream {
  rps: number
  p50: number
  p99: number
  errors: number
  requests: number
  /** CPU µs per request of the proxy process (NaN when not measured). */
  cpuPerReq?: number
}

interface StreamResult {
  /** CPU µs per chunk of the proxy process (NaN when not measured). */
  cpuPerChunk?: number
  streams: number
  completed: number
  errors: number
  samples: number
  p50: number
  p99: number
  max: number
  first_errors: string[]
}

async function freePort(): Promise<number> {
  const s = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const port = s.port
  s.stop(true)
  return port
}

async function waitListening(port: number, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    try {
      const s = await Bun.connect({ hostname: '127.0.0.1', port, socket: { data() {} } })
      s.end()
      return
    } catch {
      await Bun.sleep(50)
    }
  }
  throw new Error(`nothing listens on ${port}`)
}

async function startNginx(upstreamPort: number): Promise<{ url: string; proc: Subprocess } | null> {
  const nginx = Bun.which('nginx') ?? (Bun.file('/usr/sbin/nginx').size ? '/usr/sbin/nginx' : null)
  if (!nginx) return null
  const port = await freePort()
  const conf = `
worker_processes auto;
daemon off;
pid ${tmp}/nginx.pid;
error_log ${tmp}/nginx-error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path ${tmp}/nginx-body;
  proxy_temp_path ${tmp}/nginx-proxy;
  fastcgi_temp_path ${tmp}/nginx-fastcgi;
  uwsgi_temp_path ${tmp}/nginx-uwsgi;
  scgi_temp_path ${tmp}/nginx-scgi;
  upstream engine { server 127.0.0.1:${upstreamPort}; keepalive 256; }
  server {
    listen 127.0.0.1:${port} reuseport;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
`
  writeFileSync(join(tmp, 'nginx.conf'), conf)
  const proc = Bun.spawn([nginx, '-p', tmp, '-c', join(tmp, 'nginx.conf')], {
    stdout: 'ignore',
    stderr: 'inherit',
  })
  children.push(proc)
  await waitListening(port)
  return { url: `http://127.0.0.1:${port}`, proc }
}

/** parseWrkTime: `34.00us`, `1.20ms`, `2.00s` → microseconds. */
function parseWrkTime(s: string): number {
  const m = /([\d.]+)(us|ms|s)/.exec(s)
  if (!m) return Number.NaN
  const v = Number(m[1])
  return m[2] === 'us' ? v : m[2] === 'ms' ? v * 1000 : v * 1e6
}

const BODY = JSON.stringify({ model: 'bench-model', messages: [{ role: 'user', content: 'hi' }] })

async function nonStream(
  url: string,
  concurrency: number,
  seconds: number,
  headers: Record<string, string> = {},
): Promise<NonStream> {
  const wrk = Bun.which('wrk')
  if (wrk) {
    const script = join(tmp, 'post.lua')
    const extra = Object.entries(headers)
      .map(([n, v]) => `wrk.headers["${n}"] = "${v}"\n`)
      .join('')
    writeFileSync(
      script,
      `wrk.method = "POST"\nwrk.body = '${BODY}'\nwrk.headers["Content-Type"] = "application/json"\n${extra}`,
    )
    const p = Bun.spawn([wrk, '-t1', `-c${concurrency}`, `-d${seconds}s`, '--latency', '-s', script, url], {
      stdout: 'pipe',
      stderr: 'pipe',
    })
    const out = await new Response(p.stdout).text()
    await p.exited
    const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? Number.NaN)
    const p50 = parseWrkTime(/\s50%\s+(\S+)/.exec(out)?.[1] ?? '')
    const p99 = parseWrkTime(/\s99%\s+(\S+)/.exec(out)?.[1] ?? '')
    const non2xx = Number(/Non-2xx or 3xx responses:\s+(\d+)/.exec(out)?.[1] ?? 0)
    const sock = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out)
    const errors = non2xx + (sock ? sock.slice(1).reduce((a, b) => a + Number(b), 0) : 0)
    const requests = Number(/(\d+) requests in/.exec(out)?.[1] ?? 0)
    return { rps, p50, p99, errors, requests }
  }
  const r = await proxyLoad(url, concurrency, seconds * 1000, headers)
  return { rps: r.rps, p50: r.p50_us, p99: r.p99_us, errors: r.errors, requests: r.requests }
}

async function streams(
  url: string,
  n: number,
  watchPid?: number,
  headers: Record<string, string> = {},
): Promise<StreamResult & { peakRss?: number }> {
  let peak = 0
  const timer = watchPid
    ? setInterval(() => {
        peak = Math.max(peak, rssMb(watchPid))
      }, 50)
    : undefined
  const p = Bun.spawn(
    [BUN, join(HERE, 'proxy-stream-client.ts'), '--url', url, '--streams', String(n), ...headerArgs(headers)],
    {
      stdout: 'pipe',
      stderr: 'inherit',
      env: { ...process.env, BUN_CONFIG_MAX_HTTP_REQUESTS: '8192' },
    },
  )
  const r = JSON.parse(await new Response(p.stdout).text()) as StreamResult
  clearInterval(timer)
  return watchPid ? { ...r, peakRss: Math.max(peak, rssMb(watchPid)) } : r
}

function median(xs: number[]): number {
  const v = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b)
  if (v.length === 0) return Number.NaN
  const mid = v.length >> 1
  return v.length % 2 ? v[mid]! : (v[mid - 1]! + v[mid]!) / 2
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0)

/** The keyed proxy's column: the same proxy with 1,000 inference keys, sending a key with limits. */
const KEYS_NAME = 'modelgate /v1 (keys)'

/**
 * keysMemory: RSS (MB) of the proxy idle after boot with 100,000 inference keys in its store (made
 * by another process), and with none: each its own process, measured a second after it is up (it
 * collects garbage first).
 */
async function keysMemory(stubPort: number): Promise<{ many: number; none: number }> {
  const rss = async (keys: number) => {
    const made = keys > 0 ? await launch([BUN, join(HERE, 'make-keys.ts'), '--keys', String(keys)]) : null
    const dir = made ? ['--data-dir', made.info.dataDir as string] : []
    const s = await launch([BUN, join(HERE, 'proxy-server.ts'), '--upstream', String(stubPort), ...dir])
    await Bun.sleep(1000)
    const mb = rssMb(s.info.pid as number)
    s.proc.kill('SIGTERM')
    await s.proc.exited
    return mb
  }
  return { none: await rss(0), many: await rss(100_000) }
}

const fmt = (v: number, digits = 0) => (Number.isFinite(v) ? v.toFixed(digits) : '—')

async function main(): Promise<void> {
  const t0 = performance.now()
  const stub = await launch([BUN, join(HERE, 'proxy-stub.ts'), ...(APIS ? ['--same-length'] : [])])
  const stubPort = stub.info.port as number
  const mg = await launch([BUN, join(HERE, 'proxy-server.ts'), '--upstream', String(stubPort)])
  const mgUrl = mg.info.url as string
  const mgPid = mg.info.pid as number
  // The same proxy with 1,000 inference keys (made by make-keys.ts in its own process, loaded as
  // after a restart), sending the one with limits (which it never reaches).
  const made = await launch([BUN, join(HERE, 'make-keys.ts'), '--keys', '1000'])
  const mk = await launch([
    BUN,
    join(HERE, 'proxy-server.ts'),
    '--upstream',
    String(stubPort),
    '--data-dir',
    made.info.dataDir as string,
  ])
  const keyHeaders = { authorization: `Bearer ${made.info.key as string}` }
  const rt = await launch([BUN, join(HERE, 'router-server.ts'), '--upstream', String(stubPort)])
  const rtUrl = rt.info.url as string
  const rtPid = rt.info.pid as number
  const sink = TRACED ? await launch([BUN, join(HERE, 'otlp-sink.ts')]) : null
  const traced = sink
    ? await launch([
        BUN,
        join(HERE, 'proxy-server.ts'),
        '--upstream',
        String(stubPort),
        '--trace',
        sink.info.url as string,
        '--sample-ratio',
        String(SAMPLE_RATIO),
      ])
    : null
  const baseline = BASELINE
    ? await launch([BUN, join(BASELINE, 'test/perf/proxy-server.ts'), '--upstream', String(stubPort)])
    : null
  const routerBaseline = BASELINE
    ? await launch([BUN, join(BASELINE, 'test/perf/router-server.ts'), '--upstream', String(stubPort)])
    : null
  const ng = await startNginx(stubPort)
  const pipe = await launch([BUN, join(HERE, 'proxy-pipe.ts'), '--upstream', String(stubPort)])
  const path = '/v1/chat/completions'
  const targets: Target[] = [
    { name: 'stub (direct)', url: `http://127.0.0.1:${stubPort}${path}` },
    { name: 'modelgate /v1', url: `${mgUrl}${path}`, pid: mgPid },
    {
      name: KEYS_NAME,
      url: `${mk.info.url as string}${path}`,
      pid: mk.info.pid as number,
      headers: keyHeaders,
    },
    { name: 'modelgate /api/direct', url: `${mgUrl}/api/direct/${stubPort}${path}`, pid: mgPid },
    { name: 'router /v1 (stats on)', url: `${rtUrl}${path}`, pid: rtPid },
  ]
  if (APIS)
    for (const [name, apiPath] of [
      [RESPONSES_NAME, '/v1/responses'],
      [MESSAGES_NAME, '/v1/messages'],
    ] as const)
      targets.push({
        name,
        url: `${mk.info.url as string}${apiPath}`,
        pid: mk.info.pid as number,
        headers: keyHeaders,
      })
  if (traced)
    targets.push({ name: TRACED_NAME, url: `${traced.info.url}${path}`, pid: traced.info.pid as number })
  if (baseline)
    targets.push({
      name: BASELINE_NAME,
      url: `${baseline.info.url}${path}`,
      pid: baseline.info.pid as number,
    })
  if (routerBaseline)
    targets.push({
      name: ROUTER_BASELINE_NAME,
      url: `${routerBaseline.info.url}${path}`,
      pid: routerBaseline.info.pid as number,
    })
  if (ng) targets.push({ name: 'nginx', url: `${ng.url}${path}`, pid: ng.proc.pid })
  const pipeName = 'Bun pipe (floor)'
  targets.push({ name: pipeName, url: `${pipe.info.url as string}${path}`, pid: pipe.info.pid as number })
  await Bun.sleep(1000)
  const idleRss = rssMb(mgPid)

  // Rounds: every measurement runs once per round for every target, in an order rotated each round,
  // so slow drifts of a shared machine hit all targets alike; the table shows medians over rounds
  // and each ratio is the median of the per-round ratios (each from measurements minutes apart).
  const nsRounds = new Map<string, NonStream[]>()
  const stRounds = new Map<string, (StreamResult & { peakRss?: number })[]>()
  const push = <T>(m: Map<string, T[]>, key: string, v: T) => {
    const list = m.get(key) ?? []
    list.push(v)
    m.set(key, list)
  }
  for (const t of targets) await nonStream(t.url, 32, 1, t.headers) // warm-up: connections, JIT
  for (let round = 0; round < ROUNDS; round++) {
    const order = targets.map((_, i) => targets[(i + round) % targets.length]!)
    for (const c of CONCURRENCY) {
      for (const t of order) {
        const cpu0 = t.pid ? cpuMs(t.pid) : 0
        const r = await nonStream(t.url, c, NON_STREAM_SECONDS, t.headers)
        if (t.pid && r.requests > 0) r.cpuPerReq = ((cpuMs(t.pid) - cpu0) * 1000) / r.requests
        push(nsRounds, `${t.name}|${c}`, r)
        process.stderr.write('.')
      }
    }
    for (const n of STREAM_LEVELS) {
      for (const t of order) {
        const watch = t.name.startsWith('modelgate') ? t.pid : undefined
        const cpu0 = t.pid ? cpuMs(t.pid) : 0
        const r = await streams(t.url, n, watch, t.headers)
        // 64 token chunks and [DONE] per stream.
        if (t.pid && r.completed > 0) r.cpuPerChunk = ((cpuMs(t.pid) - cpu0) * 1000) / (r.completed * 65)
        push(stRounds, `${t.name}|${n}`, r)
        process.stderr.write('.')
        await Bun.sleep(300)
      }
    }
  }
  process.stderr.write('\n')

  // Medians over rounds (errors and stream counts summed, RSS peak the highest).
  const ns = new Map<string, NonStream>()
  for (const [key, rs] of nsRounds)
    ns.set(key, {
      rps: median(rs.map((r) => r.rps)),
      p50: median(rs.map((r) => r.p50)),
      p99: median(rs.map((r) => r.p99)),
      errors: sum(rs.map((r) => r.errors)),
      requests: sum(rs.map((r) => r.requests)),
      cpuPerReq: median(rs.map((r) => r.cpuPerReq ?? Number.NaN)),
    })
  const st = new Map<string, StreamResult & { peakRss?: number }>()
  for (const [key, rs] of stRounds)
    st.set(key, {
      streams: sum(rs.map((r) => r.streams)),
      completed: sum(rs.map((r) => r.completed)),
      errors: sum(rs.map((r) => r.errors)),
      samples: sum(rs.map((r) => r.samples)),
      p50: median(rs.map((r) => r.p50)),
      p99: median(rs.map((r) => r.p99)),
      max: median(rs.map((r) => r.max)),
      cpuPerChunk: median(rs.map((r) => r.cpuPerChunk ?? Number.NaN)),
      peakRss: Math.max(0, ...rs.map((r) => r.peakRss ?? 0)),
      first_errors: rs.flatMap((r) => r.first_errors).slice(0, 5),
    })
  /** perRound: a ratio computed within each round, from that round's measurements. */
  const perRound = (f: (round: number) => number) => Array.from({ length: ROUNDS }, (_, i) => f(i))
  const nsAt = (name: string, c: number, i: number) => nsRounds.get(`${name}|${c}`)![i]!
  const stAt = (name: string, n: number, i: number) => stRounds.get(`${name}|${n}`)![i]!

  // Report.
  const names = targets.map((t) => t.name)
  const base = names[0]!
  const rows: string[][] = [['metric', ...names]]
  for (const c of CONCURRENCY) {
    rows.push([`req/s c=${c}`, ...names.map((n) => fmt(ns.get(`${n}|${c}`)!.rps))])
    for (const q of ['p50', 'p99'] as const) {
      rows.push([
        `added ${q} µs c=${c}`,
        ...names.map((n) =>
          n === base
            ? `(${fmt(ns.get(`${n}|${c}`)![q])})`
            : fmt(ns.get(`${n}|${c}`)![q] - ns.get(`${base}|${c}`)![q]),
        ),
      ])
    }
    rows.push([`errors c=${c}`, ...names.map((n) => String(ns.get(`${n}|${c}`)!.errors))])
    rows.push([
      `proxy CPU µs/request c=${c}`,
      ...names.map((n) => fmt(ns.get(`${n}|${c}`)!.cpuPerReq ?? Number.NaN, 1)),
    ])
  }
  for (const n of STREAM_LEVELS) {
    for (const q of ['p50', 'p99', 'max'] as const)
      rows.push([`chunk delay ${q} ms @${n}`, ...names.map((x) => fmt(st.get(`${x}|${n}`)![q], 2))])
    rows.push([
      `streams ok/errors @${n}`,
      ...names.map((x) => `${st.get(`${x}|${n}`)!.completed}/${st.get(`${x}|${n}`)!.errors}`),
    ])
    rows.push([
      `proxy CPU µs/chunk @${n}`,
      ...names.map((x) => fmt(st.get(`${x}|${n}`)!.cpuPerChunk ?? Number.NaN, 1)),
    ])
  }
  const peak = Math.max(
    st.get(`modelgate /v1|1024`)?.peakRss ?? 0,
    st.get(`modelgate /api/direct|1024`)?.peakRss ?? 0,
  )
  rows.push([
    'modelgate RSS MB idle / peak @1024',
    ...names.map((n) => (n === 'modelgate /v1' ? `${fmt(idleRss)} / ${fmt(peak)}` : '')),
  ])
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)))
  const line = (r: string[]) =>
    r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ')
  console.log(
    `\nproxy benchmark (${QUICK ? 'quick' : 'full'}; ${ROUNDS} round(s), medians; ${navigator.hardwareConcurrency} CPUs; wrk: ${Bun.which('wrk') ? 'yes' : 'no (Bun client)'})\n`,
  )
  console.log(line(rows[0]!))
  console.log(widths.map((w) => '-'.repeat(w)).join('  '))
  for (const r of rows.slice(1)) console.log(line(r))
  for (const n of STREAM_LEVELS)
    for (const t of targets) {
      const errs = st.get(`${t.name}|${n}`)!.first_errors
      if (errs.length) console.log(`  ${t.name} @${n} errors: ${errs.join(' | ')}`)
    }

  if (!ng) {
    console.log(
      '\nnginx is not installed: the nginx column and the ratios are skipped (apt-get install nginx-light).',
    )
  } else {
    const mgName = 'modelgate /v1'
    const added = (name: string, c: number, i: number) => nsAt(name, c, i).p50 - nsAt(base, c, i).p50
    type Check = [string, number[], string, (ratio: number) => boolean]
    // Per-round ratios of a target's measurement to nginx's, the same for modelgate and the floor.
    const chunkP99 = (name: string) => perRound((i) => stAt(name, 1024, i).p99 / stAt('nginx', 1024, i).p99)
    const cpuPerChunk = (name: string) =>
      perRound((i) => stAt(name, 1024, i).cpuPerChunk! / stAt('nginx', 1024, i).cpuPerChunk!)
    const cpuPerReq = (name: string) =>
      perRound((i) => nsAt(name, 32, i).cpuPerReq! / nsAt('nginx', 32, i).cpuPerReq!)
    /** shown: a ratio printed for reference, with no target. */
    const shown = (what: string, ratios: number[]): Check => [what, ratios, '', () => true]
    const checks: Check[] = [
      [
        'throughput c=32, modelgate/nginx',
        perRound((i) => nsAt(mgName, 32, i).rps / nsAt('nginx', 32, i).rps),
        '≥ 0.8',
        (r) => r >= 0.8,
      ],
      [
        'added p50 latency c=1, modelgate/nginx',
        perRound((i) => added(mgName, 1, i) / added('nginx', 1, i)),
        '≤ 1.2',
        (r) => r <= 1.2,
      ],
      ['chunk delay p99 @1024, modelgate/nginx', chunkP99(mgName), '≤ 1.0', (r) => r <= 1.0],
      shown('CPU per request c=32, modelgate/nginx', cpuPerReq(mgName)),
      shown('CPU per chunk @1024, modelgate/nginx', cpuPerChunk(mgName)),
      // The floor: a proxy on Bun's sockets with no logic at all, against the same nginx.
      shown('chunk delay p99 @1024, Bun pipe/nginx', chunkP99(pipeName)),
      shown('CPU per chunk @1024, Bun pipe/nginx', cpuPerChunk(pipeName)),
      shown('CPU per request c=32, Bun pipe/nginx', cpuPerReq(pipeName)),
    ]
    console.log('\nratios (modelgate /v1 vs nginx; median of the per-round ratios, then each round):')
    for (const [what, ratios, target, ok] of checks) {
      const m = median(ratios)
      const verdict = target ? `target ${target}   ${ok(m) ? 'ok' : 'MISSED'}` : ''
      const each = ROUNDS > 1 ? `[${ratios.map((r) => fmt(r, 2)).join(' ')}]` : ''
      console.log(`  ${what.padEnd(42)} ${fmt(m, 2).padStart(6)}   ${verdict.padEnd(22)} ${each}`)
    }
  }
  const rName = 'router /v1 (stats on)'
  const gName = 'modelgate /v1'
  const rps = median(perRound((i) => nsAt(rName, 32, i).rps / nsAt(gName, 32, i).rps))
  const lat = median(
    perRound(
      (i) => (nsAt(rName, 1, i).p50 - nsAt(base, 1, i).p50) / (nsAt(gName, 1, i).p50 - nsAt(base, 1, i).p50),
    ),
  )
  console.log('\nratios (router vs gateway /v1, median of the per-round ratios, target: within 5%):')
  console.log(
    `  ${'throughput c=32, router/gateway'.padEnd(42)} ${fmt(rps, 2).padStart(6)}   ${rps >= 0.95 ? 'ok' : 'MISSED'}`,
  )
  console.log(
    `  ${'added p50 latency c=1, router/gateway'.padEnd(42)} ${fmt(lat, 2).padStart(6)}   ${lat <= 1.05 ? 'ok' : 'MISSED'}`,
  )
  console.log(
    `  modelgate RSS idle ${fmt(idleRss)} MB (target ≤ 80): ${idleRss <= 80 ? 'ok' : 'MISSED'}; ` +
      `peak at 1024 streams ${fmt(peak)} MB (target ≤ 250): ${peak <= 250 ? 'ok' : 'MISSED'}`,
  )
  // Inference keys: the keyed proxy against the same proxy without keys, round by round.
  const keysRps = median(perRound((i) => nsAt(KEYS_NAME, 32, i).rps / nsAt(gName, 32, i).rps))
  const keysP50 = median(perRound((i) => nsAt(KEYS_NAME, 1, i).p50 - nsAt(gName, 1, i).p50))
  const keysChunk = median(perRound((i) => stAt(KEYS_NAME, 1024, i).p99 - stAt(gName, 1024, i).p99))
  const memory = await keysMemory(stubPort)
  console.log(
    '\ninference keys (1,000 keys, a key with limits on every request, vs keys off; median of the per-round figures):',
  )
  console.log(
    `  ${'throughput c=32, keys/off'.padEnd(42)} ${fmt(keysRps, 2).padStart(6)}   target ≥ 0.95   ${keysRps >= 0.95 ? 'ok' : 'MISSED'}`,
  )
  console.log(
    `  ${'added p50 latency c=1, keys − off (µs)'.padEnd(42)} ${fmt(keysP50, 0).padStart(6)}   target ≤ +50    ${keysP50 <= 50 ? 'ok' : 'MISSED'}`,
  )
  console.log(`  ${'chunk delay p99 @1024, keys − off (ms)'.padEnd(42)} ${fmt(keysChunk, 2).padStart(6)}`)
  console.log(
    `  ${'RSS MB with 100,000 keys − none'.padEnd(42)} ${fmt(memory.many - memory.none, 1).padStart(6)}   target ≤ +50    ${memory.many - memory.none <= 50 ? 'ok' : 'MISSED'}   (${fmt(memory.many)} vs ${fmt(memory.none)} MB, idle after boot)`,
  )
  /** against: per-round ratios of `name` to `other` (throughput, added p50, CPU per request and per chunk). */
  const against = (
    name: string,
    other: string,
    title: string,
    target: string,
    ok: (r: number) => boolean,
  ) => {
    const lines: [string, number[], string, (r: number) => boolean][] = [
      ['throughput c=32', perRound((i) => nsAt(name, 32, i).rps / nsAt(other, 32, i).rps), target, ok],
      ['throughput c=1', perRound((i) => nsAt(name, 1, i).rps / nsAt(other, 1, i).rps), '', () => true],
      [
        'added p50 latency c=1',
        perRound(
          (i) =>
            (nsAt(name, 1, i).p50 - nsAt(base, 1, i).p50) / (nsAt(other, 1, i).p50 - nsAt(base, 1, i).p50),
        ),
        '',
        () => true,
      ],
      [
        'CPU per request c=32',
        perRound((i) => nsAt(name, 32, i).cpuPerReq! / nsAt(other, 32, i).cpuPerReq!),
        '',
        () => true,
      ],
      [
        'chunk delay p99 @1024',
        perRound((i) => stAt(name, 1024, i).p99 / stAt(other, 1024, i).p99),
        '',
        () => true,
      ],
      [
        'CPU per chunk @1024',
        perRound((i) => stAt(name, 1024, i).cpuPerChunk! / stAt(other, 1024, i).cpuPerChunk!),
        '',
        () => true,
      ],
    ]
    console.log(`\nratios (${title}; median of the per-round ratios [min–max], then each round):`)
    for (const [what, ratios, t, good] of lines) {
      const m = median(ratios)
      const verdict = t ? `target ${t}   ${good(m) ? 'ok' : 'MISSED'}` : ''
      const spread = `[${fmt(Math.min(...ratios), 2)}–${fmt(Math.max(...ratios), 2)}]`
      const each = ROUNDS > 1 ? `[${ratios.map((r) => fmt(r, 2)).join(' ')}]` : ''
      console.log(
        `  ${what.padEnd(28)} ${fmt(m, 2).padStart(6)} ${spread.padEnd(12)} ${verdict.padEnd(20)} ${each}`,
      )
    }
  }
  if (traced) {
    against(
      TRACED_NAME,
      gName,
      `modelgate /v1 traced (sample_ratio ${SAMPLE_RATIO}) vs off`,
      '≥ 0.95',
      (r) => r >= 0.95,
    )
    const count = (await (await fetch(`${sink!.info.url}/count`)).json()) as {
      spans: number
      exports: number
    }
    console.log(`  the collector received ${count.spans} spans in ${count.exports} exports`)
  }
  if (APIS) {
    against(RESPONSES_NAME, KEYS_NAME, 'Responses API vs chat, both keyed', '≥ 0.95', (r) => r >= 0.95)
    against(MESSAGES_NAME, KEYS_NAME, 'Messages API vs chat, both keyed', '≥ 0.95', (r) => r >= 0.95)
  }
  if (baseline)
    against(
      gName,
      BASELINE_NAME,
      `modelgate /v1 vs the baseline tree ${BASELINE}, both untraced`,
      '≥ 0.95',
      (r) => r >= 0.95,
    )
  if (routerBaseline)
    against(
      rName,
      ROUTER_BASELINE_NAME,
      `router /v1 vs the baseline tree's router`,
      '≥ 0.95',
      (r) => r >= 0.95,
    )
  console.log(`\ntook ${fmt((performance.now() - t0) / 1000, 1)} s`)
}

try {
  await main()
} finally {
  await stopAll(children)
  rmSync(tmp, { recursive: true, force: true })
}
