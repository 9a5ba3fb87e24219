import { useEffect, useState } from 'preact/hooks'
import { type ApiError, api } from '../api.ts'
import { ErrorNote } from '../components/error-note.tsx'
import { colorOf, type Line, TimeChart } from '../components/time-chart.tsx'
import { since } from '../format.ts'
import { canWrite } from '../session.ts'
import type { KeyCreated, KeyInput, KeyView, TimeSeries, UsageRow } from '../types.ts'

/**
 * KeysPage: inference keys. Create one (its secret shown once, with a copy button), change its
 * limits, revoke it, and see its usage per model over the last day as a chart (tokens per hour, the
 * engine's own count). Reads for both roles; the controls that change keys for `admin` only.
 */
const HOUR_MS = 3_600_000

/** Form: a key's fields as the form holds them (text inputs; '' means no limit). */
interface Form {
  name: string
  models: string
  rpm: string
  tpm: string
  max_concurrent: string
  budget_tokens: string
  budget_period: 'day' | 'month'
  priority: 'high' | 'normal' | 'low'
  expires_at: string
}

const EMPTY: Form = {
  name: '',
  models: '',
  rpm: '',
  tpm: '',
  max_concurrent: '',
  budget_tokens: '',
  budget_period: 'month',
  priority: 'normal',
  expires_at: '',
}

const LIMITS = ['rpm', 'tpm', 'max_concurrent', 'budget_tokens'] as const

function formOf(k: KeyView): Form {
  const text = (v: number | null) => (v === null ? '' : String(v))
  return {
    name: k.name,
    models: k.models?.join(', ') ?? '',
    rpm: text(k.rpm),
    tpm: text(k.tpm),
    max_concurrent: text(k.max_concurrent),
    budget_tokens: text(k.budget_tokens),
    budget_period: k.budget_period ?? 'month',
    priority: k.priority,
    expires_at: k.expires_at ? k.expires_at.slice(0, 16) : '',
  }
}

/** inputOf: the body of a create or a change (empty fields: no limit). */
function inputOf(f: Form): KeyInput {
  const models = f.models
    .split(',')
    .map((m) => m.trim())
    .filter(Boolean)
  const out: KeyInput = {
    name: f.name.trim(),
    models: models.length ? models : null,
    budget_period: f.budget_period,
    priority: f.priority,
    expires_at: f.expires_at ? new Date(f.expires_at).toISOString() : null,
  }
  for (const l of LIMITS) out[l] = f[l].trim() === '' ? null : Number(f[l])
  return out
}

function KeyFields({ form, set }: { form: Form; set: (f: Form) => void }) {
  const field = (name: keyof Form, label: string, placeholder = 'no limit') => (
    <label>
      {label}
      <input
        name={name}
        value={form[name]}
        placeholder={placeholder}
        onInput={(e) => set({ ...form, [name]: (e.target as HTMLInputElement).value })}
      />
    </label>
  )
  return (
    <div class="key-fields">
      {field('name', 'Name', 'team or app')}
      {field('models', 'Models', 'every model (or a, b, …)')}
      {field('rpm', 'Requests / min')}
      {field('tpm', 'Tokens / min')}
      {field('max_concurrent', 'Concurrent')}
      {field('budget_tokens', 'Budget (tokens)')}
      <label>
        per
        <select
          name="budget_period"
          value={form.budget_period}
          onChange={(e) =>
            set({ ...form, budget_period: (e.target as HTMLSelectElement).value as Form['budget_period'] })
          }
        >
          <option value="day">day</option>
          <option value="month">month</option>
        </select>
      </label>
      <label>
        Priority
        <select
          name="priority"
          value={form.priority}
          onChange={(e) =>
            set({ ...form, priority: (e.target as HTMLSelectElement).value as Form['priority'] })
          }
        >
          <option value="high">high</option>
          <option value="normal">normal</option>
          <option value="low">low</option>
        </select>
      </label>
      <label>
        Expires
        <input
          type="datetime-local"
          name="expires_at"
          value={form.expires_at}
          onInput={(e) => set({ ...form, expires_at: (e.target as HTMLInputElement).value })}
        />
      </label>
    </div>
  )
}

/** Secret: a key's secret, shown once, with a button that copies it. */
function Secret({ created, onDone }: { created: KeyCreated; onDone: () => void }) {
  const [copied, setCopied] = useState(false)
  const copy = async () => {
    await navigator.clipboard.writeText(created.key)
    setCopied(true)
  }
  return (
    <div class="key-secret" role="status">
      <p>
        Key <strong>{created.name}</strong> created. Copy its secret now: it is shown this once and never
        again.
      </p>
      <code data-secret>{created.key}</code>
      <button type="button" onClick={copy}>
        {copied ? 'Copied' : 'Copy key'}
      </button>
      <button type="button" onClick={onDone}>
        Done
      </button>
    </div>
  )
}

const limit = (v: number | null, unit = '') => (v === null ? '—' : `${v.toLocaleString()}${unit}`)

/** usageSeries: tokens per hour by model, from a key's usage rows, over [from, to). */
function usageSeries(rows: UsageRow[], from: number, to: number): { ts: TimeSeries; lines: Line[] } {
  const t: number[] = []
  for (let h = from; h < to; h += HOUR_MS) t.push(h)
  const models = [...new Set(rows.map((r) => r.model ?? '?'))].sort()
  const series: Record<string, (number | null)[]> = {}
  for (const m of models) series[m] = t.map(() => 0)
  for (const r of rows) {
    const i = Math.round((Date.parse(r.start) - from) / HOUR_MS)
    const s = series[r.model ?? '?']
    if (s && i >= 0 && i < t.length) s[i] = (s[i] ?? 0) + r.prompt_tokens + r.completion_tokens
  }
  return {
    ts: { interval_ms: HOUR_MS, t, series },
    lines: models.map((m, i) => ({ series: m, label: m, color: colorOf(i) })),
  }
}

function Usage({ k }: { k: KeyView }) {
  const [rows, setRows] = useState<UsageRow[] | null>(null)
  const [window, setWindow] = useState<{ from: number; to: number } | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  useEffect(() => {
    api
      .keyUsage(k.id)
      .then((u) => {
        setRows(u.rows)
        setWindow({ from: Date.parse(u.from), to: Date.parse(u.to) })
      })
      .catch(setError)
  }, [k.id])
  if (error) return <ErrorNote error={error} />
  if (!rows || !window) return <p class="muted">Reading the usage…</p>
  const { ts, lines } = usageSeries(rows, window.from, window.to)
  const sum = (f: (r: UsageRow) => number) => rows.reduce((a, r) => a + f(r), 0)
  return (
    <section class="key-usage" data-usage={k.id}>
      <p>
        Last 24 hours: <span data-figure="requests">{sum((r) => r.requests)}</span> requests,{' '}
        <span data-figure="prompt">{sum((r) => r.prompt_tokens)}</span> prompt and{' '}
        <span data-figure="completion">{sum((r) => r.completion_tokens)}</span> completion tokens,{' '}
        {sum((r) => r.errors)} errors.
      </p>
      {lines.length === 0 ? (
        <p class="muted">No request with this key in the last 24 hours.</p>
      ) : (
        <TimeChart
          id={`chart-key-${k.id}`}
          title={`Tokens per hour: ${k.name}`}
          unit="tokens"
          ts={ts}
          lines={lines}
        />
      )}
    </section>
  )
}

export function KeysPage() {
  const [keys, setKeys] = useState<KeyView[] | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  const [form, setForm] = useState<Form>(EMPTY)
  const [created, setCreated] = useState<KeyCreated | null>(null)
  const [editing, setEditing] = useState<{ id: string; form: Form } | null>(null)
  const [usageOf, setUsageOf] = useState<string | null>(null)
  const [rowError, setRowError] = useState<{ id: string; error: ApiError } | null>(null)
  const refresh = () =>
    api
      .keys()
      .then((r) => {
        setKeys(r.keys)
        setError(null)
      })
      .catch(setError)
  useEffect(() => {
    void refresh()
  }, [])
  const create = async (e: Event) => {
    e.preventDefault()
    try {
      setCreated(await api.createKey(inputOf(form)))
      setForm(EMPTY)
      setError(null)
      await refresh()
    } catch (err) {
      setError(err as ApiError)
    }
  }
  const act = async (id: string, f: () => Promise<unknown>) => {
    setRowError(null)
    try {
      await f()
      setEditing(null)
      await refresh()
    } catch (err) {
      setRowError({ id, error: err as ApiError })
    }
  }
  const shown = keys?.find((k) => k.id === usageOf)
  return (
    <div class="page keys">
      {created && <Secret created={created} onDone={() => setCreated(null)} />}
      <section class="card">
        <h2>Inference keys</h2>
        <p class="muted small">
          Limits hold per pod where requests enter; budgets (UTC day or month) across the cluster. A revoked
          key is refused from its next request on.
        </p>
        <table class="keys">
          <thead>
            <tr>
              <th>Name</th>
              <th>Models</th>
              <th>Req/min</th>
              <th>Tokens/min</th>
              <th>Concurrent</th>
              <th>Budget</th>
              <th>Priority</th>
              <th>Expires</th>
              <th>Created</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {keys?.length === 0 && (
              <tr>
                <td colSpan={10} class="muted">
                  No key yet{canWrite.value ? ': create one below.' : '.'}
                </td>
              </tr>
            )}
            {keys?.map((k) =>
              editing?.id === k.id ? (
                <tr key={k.id} data-key={k.name} class="editing">
                  <td colSpan={10}>
                    <form
                      class="inline-form"
                      onSubmit={(e) => {
                        e.preventDefault()
                        void act(k.id, () => api.updateKey(k.id, inputOf(editing.form)))
                      }}
                    >
                      <KeyFields form={editing.form} set={(f) => setEditing({ id: k.id, form: f })} />
                      <button type="submit">Save limits</button>
                      <button type="button" onClick={() => setEditing(null)}>
                        Cancel
                      </button>
                    </form>
                    {rowError?.id === k.id && <ErrorNote error={rowError.error} />}
                  </td>
                </tr>
              ) : (
                <tr key={k.id} data-key={k.name}>
                  <td>{k.name}</td>
                  <td>{k.models?.join(', ') ?? 'all'}</td>
                  <td data-figure="rpm">{limit(k.rpm)}</td>
                  <td data-figure="tpm">{limit(k.tpm)}</td>
                  <td>{limit(k.max_concurrent)}</td>
                  <td>{k.budget_tokens === null ? '—' : `${limit(k.budget_tokens)} / ${k.budget_period}`}</td>
                  <td>{k.priority}</td>
                  <td>{k.expires_at ? new Date(k.expires_at).toLocaleString() : 'never'}</td>
                  <td title={k.created_at}>{since(k.created_at)}</td>
                  <td class="actions">
                    <button type="button" onClick={() => setUsageOf(usageOf === k.id ? null : k.id)}>
                      Usage
                    </button>
                    {canWrite.value && (
                      <>
                        <button type="button" onClick={() => setEditing({ id: k.id, form: formOf(k) })}>
                          Edit limits
                        </button>
                        <button
                          type="button"
                          class="danger"
                          onClick={() => act(k.id, () => api.revokeKey(k.id))}
                        >
                          Revoke key
                        </button>
                      </>
                    )}
                    {rowError?.id === k.id && <ErrorNote error={rowError.error} />}
                  </td>
                </tr>
              ),
            )}
          </tbody>
        </table>
        {shown && <Usage k={shown} />}
      </section>
      {canWrite.value && (
        <section class="card">
          <h2>Create a key</h2>
          <form class="inline-form" onSubmit={create}>
            <KeyFields form={form} set={setForm} />
            <button type="submit" disabled={!form.name.trim()}>
              Create key
            </button>
          </form>
        </section>
      )}
      <ErrorNote error={error} />
    </div>
  )
}
