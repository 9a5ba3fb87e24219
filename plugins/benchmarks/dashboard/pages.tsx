import { useEffect, useState } from 'preact/hooks'
import { type ApiError, call, get, id, post } from '../../../src/dashboard/client/api.ts'
import { BarChart, type BarGroup } from '../../../src/dashboard/client/components/chart.tsx'
import { ErrorNote } from '../../../src/dashboard/client/components/error-note.tsx'
import { ProgressBar } from '../../../src/dashboard/client/components/progress.tsx'
import { ms, since } from '../../../src/dashboard/client/format.ts'
import { href, navigate } from '../../../src/dashboard/client/router.ts'
import { canWrite } from '../../../src/dashboard/client/session.ts'
import { followStream } from '../../../src/dashboard/client/sse.ts'
import type { BenchmarkRun, CreateRun, RunSummary, Scenario, ScenarioMetrics } from '../schemas.ts'
import { activeInstances } from './instances.ts'

/** api: the benchmarks' routes the pages call. */
const api = {
  benchmarks: () => get<{ benchmarks: RunSummary[]; total: number }>('/api/benchmarks?limit=100'),
  benchmark: (i: string) => get<{ benchmark: BenchmarkRun }>(`/api/benchmarks/${id(i)}`),
  createBenchmark: (body: CreateRun) => post<{ benchmark: BenchmarkRun }>('/api/benchmarks', body),
  deleteBenchmark: (i: string) => call<unknown>('DELETE', `/api/benchmarks/${id(i)}`),
}

/**
 * Benchmarks: the runs (pick two to compare), a form to start one, a run's page with each scenario's
 * live progress (its event stream) and, once measured, its figures and charts (TTFT, TPOT and E2E
 * percentiles, goodput), and two runs side by side.
 */
const FINISHED = new Set(['completed', 'failed', 'cancelled'])
const PERCENTILES = ['p50', 'p90', 'p99'] as const
const LATENCIES = [
  ['ttft', 'Time to first token'],
  ['tpot', 'Time per output token'],
  ['e2e', 'End-to-end latency'],
] as const

const metric = (m: ScenarioMetrics | undefined, key: string): number | null =>
  m ? ((m as unknown as Record<string, number | null>)[key] ?? null) : null

export function BenchmarksPage() {
  const [runs, setRuns] = useState<RunSummary[] | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  const [picked, setPicked] = useState<string[]>([])
  useEffect(() => {
    api
      .benchmarks()
      .then((r) => setRuns(r.benchmarks))
      .catch(setError)
  }, [])
  const toggle = (id: string) =>
    setPicked((p) => (p.includes(id) ? p.filter((x) => x !== id) : [...p, id].slice(-2)))
  return (
    <div class="page">
      {canWrite.value && <CreateForm />}
      <section class="card">
        <h2>Runs</h2>
        <ErrorNote error={error} />
        <table class="runs">
          <thead>
            <tr>
              <th />
              <th>Name</th>
              <th>Status</th>
              <th>Models</th>
              <th>Requests</th>
              <th>Created</th>
            </tr>
          </thead>
          <tbody>
            {runs?.length === 0 && (
              <tr>
                <td colSpan={6} class="muted">
                  No run yet.
                </td>
              </tr>
            )}
            {runs?.map((r) => (
              <tr key={r.id} data-run={r.id} data-status={r.status}>
                <td>
                  <input
                    type="checkbox"
                    aria-label={`compare ${r.name}`}
                    checked={picked.includes(r.id)}
                    onChange={() => toggle(r.id)}
                  />
                </td>
                <td>
                  <a href={href(`/benchmarks/${r.id}`)}>{r.name}</a>
                </td>
                <td>{r.status}</td>
                <td>{r.model_names.join(', ')}</td>
                <td>
                  {r.successful_requests}/{r.total_requests}
                </td>
                <td title={r.created_at}>{since(r.created_at)}</td>
              </tr>
            ))}
          </tbody>
        </table>
        <a
          class={`button ${picked.length === 2 ? '' : 'disabled'}`}
          aria-disabled={picked.length !== 2}
          href={picked.length === 2 ? href(`/benchmarks/compare/${picked[0]}/${picked[1]}`) : undefined}
        >
          Compare the two selected
        </a>
      </section>
    </div>
  )
}

interface ScenarioFields {
  instanceId: string
  routingMode: 'direct' | 'proxy'
  inputTokens: number
  outputTokens: number
  concurrency: number
  totalRequests: number
  warmupRequests: number
  slaMs: number
}

const FIRST: ScenarioFields = {
  instanceId: '',
  routingMode: 'direct',
  inputTokens: 128,
  outputTokens: 64,
  concurrency: 4,
  totalRequests: 20,
  warmupRequests: 2,
  slaMs: 5000,
}

/** CreateForm: a run of one or more scenarios (each a model, a route, a load shape and an SLA). */
function CreateForm() {
  const active = activeInstances.value
  const [name, setName] = useState('')
  const [mode, setMode] = useState<'isolated' | 'contention'>('isolated')
  const [list, setList] = useState<ScenarioFields[]>([FIRST])
  const [error, setError] = useState<ApiError | null>(null)
  const [busy, setBusy] = useState(false)
  const fallback = active[0]?.id ?? ''
  const set = (n: number, patch: Partial<ScenarioFields>) =>
    setList((l) => l.map((x, k) => (k === n ? { ...x, ...patch } : x)))
  const submit = async (e: Event) => {
    e.preventDefault()
    setBusy(true)
    setError(null)
    const body: CreateRun = {
      mode,
      ...(name.trim() ? { name: name.trim() } : {}),
      scenarios: list.map((f) => ({
        instanceId: f.instanceId || fallback,
        routingMode: f.routingMode,
        inputTokens: f.inputTokens,
        outputTokens: f.outputTokens,
        concurrency: f.concurrency,
        totalRequests: f.totalRequests,
        warmupRequests: f.warmupRequests,
        slaThresholdMs: f.slaMs,
      })),
    }
    try {
      const r = await api.createBenchmark(body)
      navigate(`/benchmarks/${r.benchmark.id}`)
    } catch (err) {
      setError(err as ApiError)
    } finally {
      setBusy(false)
    }
  }
  const num = (n: number, f: ScenarioFields, key: keyof ScenarioFields, label: string, min = 1) => (
    <label>
      {label}
      <input
        name={key}
        type="number"
        min={min}
        value={f[key] as number}
        onInput={(e) => set(n, { [key]: Number((e.target as HTMLInputElement).value) })}
      />
    </label>
  )
  return (
    <form class="card bench-form" onSubmit={submit}>
      <h2>New run</h2>
      <div class="fields">
        <label>
          Name
          <input name="name" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
        </label>
        <label>
          Scenarios run
          <select name="mode" value={mode} onChange={(e) => setMode(e.currentTarget.value as typeof mode)}>
            <option value="isolated">one after another (isolated)</option>
            <option value="contention">all at once (contention)</option>
          </select>
        </label>
      </div>
      {list.map((f, n) => (
        <fieldset class="bench-scenario" data-scenario-form={n} key={n}>
          <legend>Scenario {n + 1}</legend>
          <div class="fields">
            <label>
              Model
              <select
                name="instanceId"
                value={f.instanceId || fallback}
                onChange={(e) => set(n, { instanceId: e.currentTarget.value })}
              >
                {active.map((i) => (
                  <option key={i.id} value={i.id}>
                    {i.served_model_name} ({i.id})
                  </option>
                ))}
              </select>
            </label>
            <label>
              Route
              <select
                name="routingMode"
                value={f.routingMode}
                onChange={(e) =>
                  set(n, { routingMode: e.currentTarget.value as ScenarioFields['routingMode'] })
                }
              >
                <option value="direct">engine port (direct)</option>
                <option value="proxy">through /v1 (proxy)</option>
              </select>
            </label>
            {num(n, f, 'inputTokens', 'Input tokens')}
            {num(n, f, 'outputTokens', 'Output tokens')}
            {num(n, f, 'concurrency', 'Concurrency')}
            {num(n, f, 'totalRequests', 'Requests')}
            {num(n, f, 'warmupRequests', 'Warm-up', 0)}
            {num(n, f, 'slaMs', 'E2E SLA (ms)')}
          </div>
          {list.length > 1 && (
            <button type="button" onClick={() => setList((l) => l.filter((_, k) => k !== n))}>
              Remove scenario
            </button>
          )}
        </fieldset>
      ))}
      <div class="actions">
        <button type="button" onClick={() => setList((l) => [...l, { ...l[l.length - 1]! }])}>
          Add scenario
        </button>
        <button type="submit" class="primary" disabled={busy || !fallback}>
          Start benchmark
        </button>
      </div>
      {!active.length && <p class="muted small">No active model to measure: load one first.</p>}
      <ErrorNote error={error} />
    </form>
  )
}

interface Live {
  completed: number
  total: number
  phase: string
}

export function RunPage({ params }: { params: Record<string, string> }) {
  const id = params.id ?? ''
  const [run, setRun] = useState<BenchmarkRun | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  const [live, setLive] = useState<Record<string, Live>>({})
  useEffect(() => {
    let closed = false
    const load = () =>
      api
        .benchmark(id)
        .then((r) => !closed && setRun(r.benchmark))
        .catch((err) => !closed && setError(err))
    void load()
    const stop = followStream(`/api/benchmarks/${encodeURIComponent(id)}/events`, {
      onMessage: (m) => {
        const d = JSON.parse(m.data) as Record<string, unknown>
        const sid = d.scenario_id as string | undefined
        if (sid && (m.event === 'scenario:progress' || m.event === 'scenario:warmup'))
          setLive((l) => ({
            ...l,
            [sid]: {
              completed: d.completed as number,
              total: d.total as number,
              phase: m.event === 'scenario:warmup' ? 'warm-up' : 'measuring',
            },
          }))
        if (
          m.event.startsWith('scenario:') &&
          m.event !== 'scenario:progress' &&
          m.event !== 'scenario:warmup'
        )
          void load()
        if (m.event.startsWith('benchmark:') && m.event !== 'benchmark:started') {
          void load()
          stop()
        }
      },
      onDown: (err, final) => final && setError(err),
    })
    return () => {
      closed = true
      stop()
    }
  }, [id])
  if (error) return <ErrorNote error={error} />
  if (!run) return <p class="muted">Reading the run…</p>
  return (
    <div class="page" data-run={run.id} data-status={run.status}>
      <section class="card">
        <h2>
          {run.name} <span class={`status status-${run.status}`}>{run.status}</span>
        </h2>
        <p class="muted small">
          {run.mode} · {run.successful_requests}/{run.total_requests} requests succeeded
          {run.duration_seconds !== null && ` · ${run.duration_seconds.toFixed(1)} s`}
          {run.error && ` · ${run.error}`}
        </p>
      </section>
      {run.scenarios.map((s, i) => (
        <ScenarioView key={s.id} index={i} s={s} live={live[s.id]} finished={FINISHED.has(run.status)} />
      ))}
    </div>
  )
}

function ScenarioView(props: { s: Scenario; index: number; live: Live | undefined; finished: boolean }) {
  const { s, live } = props
  const m = s.metrics
  const running = s.status === 'running' || (!props.finished && !m)
  return (
    <section class="card scenario" data-scenario={s.id} data-scenario-status={s.status}>
      <h3>
        Scenario {props.index + 1}: {s.model_name}{' '}
        <span class="muted small">
          {s.routing_mode} · {s.input_tokens}→{s.output_tokens} tokens · concurrency {s.concurrency} ·{' '}
          {s.total_requests} requests
        </span>
      </h3>
      {running && (
        <ProgressBar
          percent={live ? (live.completed / Math.max(1, live.total)) * 100 : 0}
          label={live ? `${live.phase} ${live.completed}/${live.total}` : s.status}
        />
      )}
      {s.error && <p class="error">{s.error}</p>}
      {m && m.failed_requests > 0 && <Failures m={m} />}
      {m && <Figures runs={[{ label: s.model_name, m }]} />}
    </section>
  )
}

/** Failures: why a scenario's requests failed: the counts by cause and the first messages. */
function Failures({ m }: { m: ScenarioMetrics }) {
  const causes = Object.entries(m.failed_by_status ?? {})
  const first = m.first_errors ?? m.errors.map((e) => e.message)
  return (
    <div class="failures" data-failures>
      <p>
        {m.failed_requests} of {m.total_requests} requests failed
        {causes.length > 0 && ': '}
        {causes.map(([status, n], i) => (
          <span key={status} data-failed-status={status}>
            {i > 0 && ', '}
            {status} × {n}
          </span>
        ))}
      </p>
      <ul class="small">
        {first.map((e) => (
          <li key={e} data-first-error>
            <code>{e}</code>
          </li>
        ))}
      </ul>
    </div>
  )
}

/** Figures: a table of the headline figures and the latency and goodput charts, for one or two runs. */
function Figures({ runs }: { runs: { label: string; m: ScenarioMetrics }[] }) {
  const groups = (prefix: string): BarGroup[] =>
    PERCENTILES.map((p) => ({
      label: p,
      bars: runs.map((r, i) => ({ label: r.label, value: metric(r.m, `${prefix}_${p}`), series: i })),
    }))
  const rows: [string, (m: ScenarioMetrics) => string][] = [
    ['Requests ok / failed', (m) => `${m.successful_requests} / ${m.failed_requests}`],
    ['TTFT p50 / p99', (m) => `${ms(m.ttft_p50)} / ${ms(m.ttft_p99)}`],
    ['TPOT p50 / p99', (m) => `${ms(m.tpot_p50)} / ${ms(m.tpot_p99)}`],
    ['E2E p50 / p99', (m) => `${ms(m.e2e_p50)} / ${ms(m.e2e_p99)}`],
    ['Output tokens/s', (m) => (m.tokens_per_second_total ?? 0).toFixed(1)],
    [
      'Goodput',
      (m) => `${m.goodput_percent.toFixed(1)}% (${m.goodput_requests_per_second.toFixed(2)} req/s)`,
    ],
  ]
  return (
    <div class="figures">
      <table class="metrics">
        <thead>
          <tr>
            <th />
            {runs.map((r, i) => (
              <th key={r.label} class={`series-${i}`}>
                {r.label}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {rows.map(([label, f]) => (
            <tr key={label}>
              <th>{label}</th>
              {runs.map((r) => (
                <td key={r.label} data-figure={label}>
                  {f(r.m)}
                </td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
      <div class="charts">
        {LATENCIES.map(([prefix, title]) => (
          <BarChart key={prefix} id={prefix} title={title} unit="ms" groups={groups(prefix)} />
        ))}
        <BarChart
          id="goodput"
          title="Goodput"
          unit="% of requests within SLA"
          groups={[
            {
              label: 'goodput',
              bars: runs.map((r, i) => ({ label: r.label, value: r.m.goodput_percent, series: i })),
            },
          ]}
        />
      </div>
    </div>
  )
}

export function ComparePage({ params }: { params: Record<string, string> }) {
  const [runs, setRuns] = useState<BenchmarkRun[] | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  useEffect(() => {
    Promise.all([api.benchmark(params.a ?? ''), api.benchmark(params.b ?? '')])
      .then((r) => setRuns(r.map((x) => x.benchmark)))
      .catch(setError)
  }, [params.a, params.b])
  if (error) return <ErrorNote error={error} />
  if (!runs) return <p class="muted">Reading the runs…</p>
  const count = Math.max(...runs.map((r) => r.scenarios.length))
  return (
    <div class="page compare">
      {Array.from({ length: count }, (_, i) => {
        const both = runs.flatMap((r) => {
          const m = r.scenarios[i]?.metrics
          return m ? [{ label: r.name, m }] : []
        })
        return (
          <section class="card" key={i}>
            <h3>Scenario {i + 1}</h3>
            {both.length ? <Figures runs={both} /> : <p class="muted">Not measured in either run.</p>}
          </section>
        )
      })}
    </div>
  )
}
