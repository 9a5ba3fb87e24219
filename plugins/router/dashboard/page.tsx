import type { Static } from 'elysia'
import { useEffect, useState } from 'preact/hooks'
import { type ApiError, get, id, post } from '../../../src/dashboard/client/api.ts'
import { ErrorNote } from '../../../src/dashboard/client/components/error-note.tsx'
import { ms, since } from '../../../src/dashboard/client/format.ts'
import { onLive } from '../../../src/dashboard/client/live.ts'
import { canWrite } from '../../../src/dashboard/client/session.ts'
import type { ActionResultSchema } from '../schemas.ts'
import type { RouterOverview } from './changes.ts'

type RouterAction = Static<typeof ActionResultSchema>

/** api: the router's routes on the main listener that the page calls (dashboard/routes.ts). */
const api = {
  router: () => get<RouterOverview>('/api/dashboard/router'),
  routerSleep: (name: string) => post<RouterAction>(`/api/dashboard/router/models/${id(name)}/sleep`),
  routerWake: (name: string) => post<RouterAction>(`/api/dashboard/router/models/${id(name)}/wake`),
}

/**
 * RouterPage: the traffic-routing controller's models with their traffic, idle or active state,
 * sleep status and whether auto-sleep would take them now, with sleep and wake (admin). It reads
 * the router once, then applies each overview the router publishes on the live stream as it
 * changes (`router.changed`: a request ended, a sleep or wake, an idle check): it never polls.
 */
export function RouterPage() {
  const [view, setView] = useState<RouterOverview | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  const [rowError, setRowError] = useState<{ model: string; error: ApiError } | null>(null)
  const [busy, setBusy] = useState<string | null>(null)
  useEffect(() => {
    // An overview from the stream is newer than the first read when it comes first.
    let pushed = false
    const off = onLive<RouterOverview>('router.changed', (v) => {
      pushed = true
      setView(v)
      setError(null)
    })
    api
      .router()
      .then((v) => {
        if (!pushed) setView(v)
        setError(null)
      })
      .catch(setError)
    return off
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
              // A catalogued model with no instance (or one still loading) does not sleep: no Sleep, no Wake.
              const engineless = state === 'unloaded' || state === 'loading'
              return (
                <tr key={m.id} data-model={m.id} data-state={state}>
                  <td>
                    {m.id}
                    <div class="muted small">
                      {engineless ? 'no engine: a request loads it' : `${m.endpoint.host}:${m.endpoint.port}`}
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
                      {engineless ? null : state === 'sleeping' ? (
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
