import { afterAll, beforeAll, describe, expect, it } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import type { Subprocess } from 'bun'
import { parse } from 'yaml'
import { freePort } from '../sim/helpers.ts'
import { startGateway, type TestGateway } from '../support/gateway.ts'
import { waitFor } from '../support/wait.ts'

/**
 * The Grafana board and the alert rules against a real Prometheus (Debian's `prometheus`) scraping
 * a real modelgate (simulated engines) under a little traffic: a load, streamed chats, a sleep, a
 * request held while the model wakes. Every PromQL expression of the board and of the rules goes
 * through Prometheus' HTTP API: each parses, each board query that should have data after this
 * traffic has it, and no alert fires on this healthy host. `promtool check rules` and `promtool test
 * rules` (each alert firing and not firing) run too. Without Prometheus the test skips, naming the
 * package; with CI set it fails (.ci/run installs it).
 */
const ROOT = resolve(import.meta.dir, '../..')
const BOARD = join(ROOT, 'config/grafana/modelgate.json')
const RULES = join(ROOT, 'config/prometheus/alerts.yaml')
const MODEL = 'Qwen/Qwen2.5-0.5B'

const prometheus = Bun.which('prometheus')
const promtool = Bun.which('promtool')
const missing = !prometheus || !promtool
if (missing) {
  const why = 'prometheus/promtool not found (Debian package "prometheus")'
  if (process.env.CI) throw new Error(`${why}: .ci/run installs it`)
  console.warn(`prometheus.test.ts: ${why}; skipping`)
}

/**
 * Board queries with no data on this host, and why: no cluster plugin here (its four panels), no
 * request failed (5xx), no load failed, every sleep freed what it should, no catalogue (so no cold
 * start and nothing evicted) and no inference key (the per-key panels).
 */
const NO_DATA_HERE = [
  /modelgate_cluster_/,
  /modelgate_residency_actions_total|modelgate_cold_starts_total/,
  /modelgate_key_/,
  /status=~"5\.\."/,
  /modelgate_model_load_failures_total/,
  /modelgate_model_sleep_verification_failures_total/,
]

/** grafana: an expression as Grafana sends it, its variables set (all instances, a 1 m rate window). */
const grafana = (expr: string) =>
  expr.replaceAll('$instance', '.+').replaceAll('$__rate_interval', '1m').replaceAll('$__range', '10m')

function boardExpressions(): { panel: string; expr: string }[] {
  const board = JSON.parse(readFileSync(BOARD, 'utf8')) as {
    panels: { title: string; targets?: { expr: string }[] }[]
  }
  return board.panels.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr })))
}

function ruleExpressions(): { alert: string; expr: string }[] {
  const doc = parse(readFileSync(RULES, 'utf8')) as { groups: { rules: { alert: string; expr: string }[] }[] }
  return doc.groups.flatMap((g) => g.rules.map((r) => ({ alert: r.alert, expr: r.expr.trim() })))
}

describe.skipIf(missing)('the Grafana board and the alert rules on a real Prometheus', () => {
  let gw: TestGateway
  let prom: Subprocess | null = null
  let promUrl = ''
  const dir = mkdtempSync(join(tmpdir(), 'modelgate-prom-'))

  async function query(
    expr: string,
  ): Promise<{ status: string; error?: string; data?: { result: unknown[] } }> {
    const res = await fetch(`${promUrl}/api/v1/query?query=${encodeURIComponent(expr)}`)
    return (await res.json()) as { status: string; error?: string; data?: { result: unknown[] } }
  }

  beforeAll(async () => {
    gw = await startGateway({
      ports: [23540, 23549],
      env: { SIM_WAKE_DELAY_MS: '300', SIM_TOKENS_PER_SEC: '400', SIM_TTFT_MS: '10' },
      extraYaml: '    proxy: { wake_on_request: hold, hold_timeout: 30 }\n',
    })
    const port = await freePort()
    promUrl = `http://127.0.0.1:${port}`
    const target = new URL(gw.url).host
    writeFileSync(
      join(dir, 'prometheus.yml'),
      `global: { scrape_interval: 2s, scrape_timeout: 2s, evaluation_interval: 2s }\nscrape_configs:\n  - job_name: modelgate\n    static_configs: [{ targets: ['${target}'] }]\n`,
    )
    prom = Bun.spawn(
      [
        prometheus!,
        `--config.file=${join(dir, 'prometheus.yml')}`,
        `--storage.tsdb.path=${join(dir, 'data')}`,
        `--web.listen-address=127.0.0.1:${port}`,
        '--log.level=warn',
      ],
      { stdout: 'ignore', stderr: 'pipe' },
    )
    await waitFor(
      'prometheus ready',
      () =>
        fetch(`${promUrl}/-/ready`).then(
          (r) => r.ok,
          () => false,
        ),
      {
        timeoutMs: 20_000,
        pollMs: 100,
      },
    )

    // Traffic: a load, streamed chats, a sleep, a request held while the model wakes, more chats.
    const id = await gw.load({
      model_path: MODEL,
      enable_sleep_mode: true,
      gpu_ids: [0],
      gpu_memory_utilization: 0.3,
    })
    await gw.waitStatus(id, 'active')
    const chat = async () => {
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: MODEL,
          messages: [{ role: 'user', content: 'hi' }],
          max_tokens: 24,
          stream: true,
        }),
      })
      expect(res.status).toBe(200)
      await res.text()
    }
    for (let i = 0; i < 6; i++) await chat()
    expect((await gw.json(`/api/models/instances/${id}/sleep?level=1`, { method: 'POST' })).status).toBe(200)
    await chat() // held until the wake it starts has finished
    // Enough scrapes after the traffic for every rate: the engines' token counters are read every 5 s.
    await waitFor(
      'the traffic scraped',
      async () => {
        for (let i = 0; i < 2; i++) await chat()
        const done = await query('sum(increase(modelgate_model_generation_tokens_total[1m])) > 0')
        const held = await query('sum(modelgate_request_hold_seconds_count) > 0')
        // Every scrape of the last 20 s succeeded (a slow one would leave the gauges stale).
        const up = await query(
          'min_over_time(up{job="modelgate"}[20s]) == 1 and count_over_time(up{job="modelgate"}[20s]) >= 8',
        )
        return [done, held, up].every((r) => (r.data?.result.length ?? 0) > 0)
      },
      { timeoutMs: 45_000, pollMs: 500 },
    )
  }, 120_000)

  afterAll(async () => {
    prom?.kill()
    await prom?.exited
    await gw?.stop()
    rmSync(dir, { recursive: true, force: true })
  })

  it('passes promtool check rules and its unit tests of every alert', () => {
    const check = Bun.spawnSync([promtool!, 'check', 'rules', RULES])
    expect(check.stdout.toString() + check.stderr.toString()).toContain('SUCCESS: 7 rules found')
    expect(check.exitCode).toBe(0)
    const tests = Bun.spawnSync([promtool!, 'test', 'rules', 'alerts.test.yaml'], {
      cwd: join(ROOT, 'config/prometheus'),
    })
    expect(tests.stdout.toString() + tests.stderr.toString()).toContain('SUCCESS')
    expect(tests.exitCode).toBe(0)
  })

  it('evaluates every board query, each with data unless this host has none to give', async () => {
    const exprs = boardExpressions()
    expect(exprs.length).toBeGreaterThan(20)
    const empty: string[] = []
    for (const { panel, expr } of exprs) {
      const r = await query(grafana(expr))
      expect({ panel, expr, status: r.status, error: r.error }).toEqual({
        panel,
        expr,
        status: 'success',
        error: undefined,
      })
      const hasData = (r.data?.result.length ?? 0) > 0
      const expectEmpty = NO_DATA_HERE.some((re) => re.test(expr))
      if (hasData === expectEmpty) empty.push(`${panel}: ${expr} (${hasData ? 'has data' : 'no data'})`)
    }
    expect(empty).toEqual([])
  })

  it('evaluates every alert expression: it parses, its figure has data, and nothing fires on a healthy host', async () => {
    for (const { alert, expr } of ruleExpressions()) {
      const r = await query(expr)
      expect({ alert, status: r.status, error: r.error }).toEqual({
        alert,
        status: 'success',
        error: undefined,
      })
      expect({ alert, firing: r.data?.result }).toEqual({ alert, firing: [] })
      // The figure compared with its threshold exists here, except where nothing of it happened
      // (no cluster plugin, no sleep that freed too little, no 5xx: a status series exists once seen).
      if (/cluster|verification|5\.\./.test(expr)) continue
      const figure = expr.replace(/\s*>\s*[\d.]+\s*$/, '')
      const f = await query(figure)
      expect({ alert, figure, series: (f.data?.result.length ?? 0) > 0 }).toEqual({
        alert,
        figure,
        series: true,
      })
    }
  })
})
