import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { plugins } from '../../plugins/index.ts'
import { gatewayYaml } from '../support/gateway.ts'
import { startHost, type TestHost } from '../support/host.ts'
import { REPLAY_RESIDENCY, type ReplayModel } from './residency-replay.ts'
import type { TraceEvent } from './residency-trace.ts'

/**
 * bench:residency --live: a trace replayed against a real gateway (in this process) with simulated
 * engines (processes) on 2 x 80 GB simulated GPUs, in wall time scaled by `scale`: the simulator's
 * loads and wakes take vLLM's published time for the model's size times the scale
 * (SIM_TIME_SCALE), the trace is replayed that much faster, and the residency settings that are
 * times are scaled too; every figure is converted back to simulated seconds (wall / scale).
 * Everything modelgate and the simulator do in real time counts 1 / scale times over (as does every
 * stall of a busy machine), so this is the end-to-end check, run at scale 0.2 or more; the verdict
 * is the virtual-time replay's (residency-replay.ts).
 *
 * Every policy starts from the same warm host: the first `preload` models preloaded, as an operator
 * would, and the trace begins once they serve (a cold host makes every policy wait for the same
 * cold loads, which says nothing about the policies).
 */
export type LivePolicy = 'cost' | 'lru' | 'lru-sleep' | 'static'

export interface LiveOptions {
  scale: number
  minutes: number
  models: readonly ReplayModel[]
  /** The first `preload` models are preloaded; the trace begins once they serve. */
  preload: number
  dump: string
}

export interface LiveOutcome {
  policy: LivePolicy
  served: number
  failed: number
  ttft: number[]
  coldLoads: number
  wakes: number
  evictions: number
  gpuMemoryHours: number
  failures: Map<string, number>
  requests: { at: number; model: string; ttft_s?: number; error?: string }[]
}

function yaml(policy: LivePolicy, o: LiveOptions): string {
  const s = (seconds: number) => Math.max(1, Math.round(seconds * o.scale))
  const entries = (policy === 'static' ? o.models.slice(0, o.preload) : o.models)
    .map(
      (m) =>
        `      - { name: ${m.name}, model_path: org/${m.name}, gpu_memory_utilization: ${m.util}, enable_sleep_mode: true${o.models.indexOf(m) < o.preload ? ', preload: true' : ''} }`,
    )
    .join('\n')
  // The shipped defaults (as the replay runs them), the durations among them scaled to wall time.
  const d = REPLAY_RESIDENCY
  const residency = {
    policy: policy === 'static' ? 'off' : policy,
    min_resident_seconds: s(d.min_resident_seconds),
    horizon_seconds: s(d.horizon_seconds),
    rate_window_seconds: s(d.rate_window_seconds),
    queue_timeout_seconds: d.queue_timeout_seconds,
    max_queue: d.max_queue,
    host_memory_budget_gib: d.host_memory_budget_gib,
  }
  return `    residency: ${JSON.stringify(residency)}\n    catalog:\n${entries}\n`
}

async function boot(policy: LivePolicy, o: LiveOptions): Promise<{ th: TestHost; simDir: string }> {
  const simDir = mkdtempSync(join(tmpdir(), 'modelgate-bench-residency-'))
  const text = gatewayYaml(
    {
      ports: [19500, 19599],
      gpus: '2x80',
      env: { SIM_TIME_SCALE: String(o.scale), SIM_TTFT_MS: '0', SIM_TOKENS_PER_SEC: '2000' },
      extraYaml: yaml(policy, o),
    },
    simDir,
  ).replace('log: { level: debug }', 'log: { level: warn }')
  const th = await startHost(text, plugins, {}, undefined, { logLevel: 'warn' })
  return { th, simDir }
}

/** ttftOf: one streamed chat; wall ms to its first content chunk, or the failure. */
async function ttftOf(url: string, model: string): Promise<{ ms: number } | { error: string }> {
  const t0 = performance.now()
  let res: Response
  try {
    res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model,
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 4,
        stream: true,
      }),
    })
  } catch (err) {
    return { error: `fetch: ${(err as Error).message}` }
  }
  if (res.status !== 200) {
    const text = await res.text().catch(() => '')
    let message = ''
    try {
      message = (JSON.parse(text) as { error?: { message?: string } }).error?.message ?? ''
    } catch {}
    return { error: `${res.status} ${message.slice(0, 300)}`.trim() }
  }
  const reader = res.body!.getReader()
  let first: number | null = null
  for (;;) {
    const { value, done } = await reader.read()
    if (done) break
    if (first === null && value && new TextDecoder().decode(value).includes('"content"'))
      first = performance.now()
  }
  return first === null ? { error: 'no content' } : { ms: first - t0 }
}

async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text()
  let n = 0
  for (const line of text.split('\n'))
    if (line.startsWith(name)) n += Number(line.slice(line.lastIndexOf(' ') + 1)) || 0
  return n
}

export async function runLive(
  policy: LivePolicy,
  trace: readonly TraceEvent[],
  o: LiveOptions,
): Promise<LiveOutcome> {
  const { th, simDir } = await boot(policy, o)
  const out: LiveOutcome = {
    policy,
    served: 0,
    failed: 0,
    ttft: [],
    coldLoads: 0,
    wakes: 0,
    evictions: 0,
    gpuMemoryHours: 0,
    failures: new Map(),
    requests: [],
  }
  try {
    // The first three are preloaded: the trace begins once they serve.
    const warm = async () => {
      const r = (await (await fetch(`${th.url}/api/residency`)).json()) as {
        models: { name: string; state: string }[]
      }
      return o.models
        .slice(0, o.preload)
        .every((m) => r.models.find((x) => x.name === m.name)?.state === 'active')
    }
    const deadline = performance.now() + 600_000
    while (!(await warm())) {
      if (performance.now() > deadline) throw new Error('the preloads did not finish in 10 minutes')
      await Bun.sleep(100)
    }
    const wakesBefore = await metric(th.url, 'modelgate_model_wake_duration_seconds_count')
    // GPU memory in use, integrated over the run (sampled every simulated 10 s).
    let memSamples = 0
    let memSum = 0
    const sampler = setInterval(async () => {
      const snap = await th.host
        .api<{ gpuSnapshot(): Promise<{ available: boolean; gpus?: { memoryUsedMib: number | null }[] }> }>(
          'gateway',
        )
        .gpuSnapshot()
      if (!snap.available || !snap.gpus) return
      memSum += snap.gpus.reduce((s, g) => s + (g.memoryUsedMib ?? 0), 0) / 1024
      memSamples++
    }, 10_000 * o.scale)
    const t0 = performance.now()
    const events: unknown[] = []
    if (o.dump)
      th.host.bus.on('gateway.instance.lifecycle', (e) => {
        const c = e.change
        events.push({
          at: Math.round(((e.at - t0) / 1000 / o.scale) * 10) / 10,
          model: e.served_model_name,
          ...(c.kind === 'state'
            ? { state: `${c.previous}→${c.current}` }
            : c.kind === 'operation'
              ? { operation: c.operation, running: c.running }
              : { routing: c.routing }),
        })
      })
    const pending: Promise<void>[] = []
    for (const e of trace) {
      const due = t0 + e.at * 1000 * o.scale
      const wait = due - performance.now()
      if (wait > 0) await Bun.sleep(wait)
      pending.push(
        ttftOf(th.url, e.model).then((r) => {
          out.requests.push({
            at: e.at,
            model: e.model,
            ...('ms' in r ? { ttft_s: r.ms / 1000 / o.scale } : { error: r.error }),
          })
          if ('ms' in r) {
            out.served++
            out.ttft.push(r.ms / 1000 / o.scale)
          } else {
            out.failed++
            out.failures.set(r.error, (out.failures.get(r.error) ?? 0) + 1)
          }
        }),
      )
    }
    await Promise.all(pending)
    clearInterval(sampler)
    const simulatedHours = (o.minutes * 60) / 3600
    out.gpuMemoryHours = memSamples ? (memSum / memSamples) * simulatedHours : 0
    out.coldLoads = await metric(th.url, 'modelgate_cold_starts_total')
    out.wakes = (await metric(th.url, 'modelgate_model_wake_duration_seconds_count')) - wakesBefore
    out.evictions = await metric(th.url, 'modelgate_residency_actions_total')
    if (o.dump) {
      const decisions = await (await fetch(`${th.url}/api/residency`)).json()
      out.requests.sort((a, b) => a.at - b.at)
      writeFileSync(
        join(o.dump, `live-${policy}.json`),
        JSON.stringify({ requests: out.requests, events, residency: decisions }, null, 1),
      )
    }
  } finally {
    await th.stop()
    rmSync(simDir, { recursive: true, force: true })
  }
  return out
}
