import { useEffect, useState } from 'preact/hooks'
import { type ApiError, api } from '../api.ts'
import { ErrorNote } from '../components/error-note.tsx'
import { ms, since } from '../format.ts'
import type { Page } from '../page.ts'
import { canWrite } from '../session.ts'
import type { RouterOverview } from '../types.ts'

/**
 * RouterPage: the traffic-routing controller's models with their traffic, idle or active state,
 * sleep status and whether auto-sleep would take them now, with sleep and wake (admin). The router
 * has no event stream of its own: the page reads it every 5 s and after each action it takes.
 */
const REFRESH_MS = 5000

function RouterPage() {
  const [view, setView] = useState<RouterOverview | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  const [rowError, setRowError] = useState<{ model: string; error: ApiError } | null>(null)
  const [busy, setBusy] = useState<string | null>(null)
  const refresh = () =>
    api
      .router()
      .then((v) => {
        setView(v)
        setError(null)
      })
      .catch(setError)
  useEffect(() => {
    let stopped = false
    let timer: ReturnType<typeof setTimeout> | undefined
    const tick = async () => {
      await refresh()
      if (!stopped) timer = setTimeout(tick, REFRESH_MS)
    }
    void tick()
    return () => {
      stopped = true
      clearTimeout(timer)
    }
  }, [])
  const act = async (model: string, f: (m: string) => Promise<unknown>) => {
    setBusy(model)
    setRowError(null)
    try {
      await f(model)
    } catch (err) {
      setRowError({ model, error: err as ApiError })
    } finally {
      setBusy(null)
      await refresh()
    }
  }
  if (!view) return error ? <ErrorNote error={error} /> : <p class="muted">Reading the router…</p>
  const candidates = new Set(view.candidates.candidates.map((c) => c.model))
  const o = view.traffic.overall
  return (
    <div class="page router">
      <ErrorNote error={error} />
      <div class="summary">
        <div class="stat">
          <span class="stat-value">{o.total_requests}</span>
          <span class="stat-label">
            requests · {o.failed_requests} failed · {o.request_rate.toFixed(1)}/min
          </span>
        </div>
        <div class="stat">
          <span class="stat-value">{view.candidates.auto_sleep_enabled ? 'on' : 'off'}</span>
          <span class="stat-label">auto-sleep after {view.candidates.idle_threshold} s idle</span>
        </div>
      </div>
      <section class="card">
        <table class="router-models">
          <thead>
            <tr>
              <th>Model</th>
              <th>State</th>
              <th>Requests</th>
              <th>Avg response</th>
              <th>Last activity</th>
              {canWrite.value && <th />}
            </tr>
          </thead>
          <tbody>
            {view.models.length === 0 && (
              <tr>
                <td colSpan={6} class="muted">
                  The router knows no model.
                </td>
              </tr>
            )}
            {view.models.map((m) => {
              const s = view.sleep[m.id]
              const t = view.traffic.by_model[m.id]
              const state = s?.status ?? 'active'
              return (
                <tr key={m.id} data-model={m.id} data-state={state}>
                  <td>
                    {m.id}
                    <div class="muted small">
                      {m.endpoint.host}:{m.endpoint.port}
                    </div>
                  </td>
                  <td>
                    <span class={`status status-${state}`}>{state}</span>
                    {s?.sleep_level ? <span class="muted small"> level {s.sleep_level}</span> : null}
                    {candidates.has(m.id) && <div class="muted small">idle: a sleep candidate</div>}
                  </td>
                  <td data-figure="requests">
                    {t ? `${t.successful_requests}/${t.total_requests}` : '0/0'}
                    {t && t.failed_requests > 0 && (
                      <span class="error small"> {t.failed_requests} failed</span>
                    )}
                  </td>
                  <td>{t ? ms(t.avg_response_time * 1000) : '—'}</td>
                  <td title={t?.last_activity ?? ''}>{t?.last_activity ? since(t.last_activity) : '—'}</td>
                  {canWrite.value && (
                    <td class="actions">
                      {state === 'sleeping' ? (
                        <button
                          type="button"
                          disabled={busy === m.id}
                          onClick={() => act(m.id, api.routerWake)}
                        >
                          Wake
                        </button>
                      ) : (
                        <button
                          type="button"
                          disabled={busy === m.id || state !== 'active'}
                          onClick={() => act(m.id, api.routerSleep)}
                        >
                          Sleep
                        </button>
                      )}
                      {rowError?.model === m.id && <ErrorNote error={rowError.error} />}
                    </td>
                  )}
                </tr>
              )
            })}
          </tbody>
        </table>
      </section>
    </div>
  )
}

export const routerPage: Page = {
  id: 'router',
  title: 'Router',
  nav: 'Router',
  path: '/router',
  component: RouterPage,
  requires: 'router',
}
