import { useEffect, useState } from 'preact/hooks'
import { ErrorNote } from '../../../../../src/dashboard/client/components/error-note.tsx'
import { ProgressBar } from '../../../../../src/dashboard/client/components/progress.tsx'
import { gib, since } from '../../../../../src/dashboard/client/format.ts'
import { canWrite } from '../../../../../src/dashboard/client/session.ts'
import { followStream } from '../../../../../src/dashboard/client/sse.ts'
import { type ApiError, api } from '../api.ts'
import type { MemoryProfile, PresetProgressEvent, PresetSummary } from '../types.ts'

/**
 * PresetsPage: configuration presets (save what runs now, load one with its progress, delete) and the
 * memory profiles the pre-load check and cluster placement use, with their figures. Lists are
 * read when the page opens and after each change made here; a preset load's progress comes live from
 * GET /api/configurations/events.
 */
function usePresetProgress(): PresetProgressEvent | null {
  const [last, setLast] = useState<PresetProgressEvent | null>(null)
  useEffect(
    () =>
      followStream('/api/configurations/events', {
        onMessage: (m) => {
          if (m.event === 'preset_progress') setLast(JSON.parse(m.data) as PresetProgressEvent)
        },
      }),
    [],
  )
  return last
}

function Presets() {
  const [list, setList] = useState<PresetSummary[] | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  const [rowError, setRowError] = useState<{ id: string; error: ApiError } | null>(null)
  const [name, setName] = useState('')
  const [busy, setBusy] = useState(false)
  const progress = usePresetProgress()
  const refresh = () =>
    api
      .presets()
      .then((r) => {
        setList(r.configurations)
        setError(null)
      })
      .catch(setError)
  useEffect(() => {
    void refresh()
  }, [])
  useEffect(() => {
    if (progress?.phase === 'completed' || progress?.phase === 'failed') void refresh()
  }, [progress?.phase])

  const save = async (e: Event) => {
    e.preventDefault()
    setBusy(true)
    try {
      await api.savePreset(name.trim())
      setName('')
      setError(null)
      await refresh()
    } catch (err) {
      setError(err as ApiError)
    } finally {
      setBusy(false)
    }
  }
  const act = async (id: string, f: () => Promise<unknown>) => {
    setRowError(null)
    try {
      await f()
      await refresh()
    } catch (err) {
      setRowError({ id, error: err as ApiError })
    }
  }
  const running = progress && !['completed', 'failed'].includes(progress.phase) ? progress : null
  return (
    <section class="card">
      <h2>Presets</h2>
      {progress && (
        <div class="preset-progress" data-phase={progress.phase}>
          <strong>{progress.configName}</strong>: {progress.message}
          {running && (
            <ProgressBar
              percent={progress.total ? ((progress.loaded + progress.failed) / progress.total) * 100 : 0}
              label={`${progress.phase} ${progress.loaded}/${progress.total}`}
            />
          )}
        </div>
      )}
      <table class="presets">
        <thead>
          <tr>
            <th>Name</th>
            <th>Models</th>
            <th>Saved</th>
            {canWrite.value && <th />}
          </tr>
        </thead>
        <tbody>
          {list?.length === 0 && (
            <tr>
              <td colSpan={4} class="muted">
                No preset saved yet.
              </td>
            </tr>
          )}
          {list?.map((p) => (
            <tr key={p.id} data-preset={p.name}>
              <td>
                {p.name}
                {p.description && <div class="muted small">{p.description}</div>}
              </td>
              <td>{p.modelCount}</td>
              <td title={p.createdAt}>{since(p.createdAt)}</td>
              {canWrite.value && (
                <td class="actions">
                  <button type="button" onClick={() => act(p.id, () => api.loadPreset(p.id))}>
                    Load preset
                  </button>
                  <button
                    type="button"
                    class="danger"
                    onClick={() => act(p.id, () => api.deletePreset(p.id))}
                  >
                    Delete preset
                  </button>
                  {rowError?.id === p.id && <ErrorNote error={rowError.error} />}
                </td>
              )}
            </tr>
          ))}
        </tbody>
      </table>
      {canWrite.value && (
        <form class="inline-form" onSubmit={save}>
          <label>
            Save the running models as
            <input
              name="preset-name"
              value={name}
              placeholder="preset name"
              required
              onInput={(e) => setName((e.target as HTMLInputElement).value)}
            />
          </label>
          <button type="submit" disabled={busy || !name.trim()}>
            Save preset
          </button>
        </form>
      )}
      <ErrorNote error={error} />
    </section>
  )
}

function Profiles() {
  const [list, setList] = useState<MemoryProfile[] | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  const refresh = () =>
    api
      .profiles()
      .then((r) => {
        setList(r.profiles)
        setError(null)
      })
      .catch(setError)
  useEffect(() => {
    void refresh()
  }, [])
  const remove = async (id: string) => {
    try {
      await api.deleteProfile(id)
      await refresh()
    } catch (err) {
      setError(err as ApiError)
    }
  }
  return (
    <section class="card">
      <h2>Memory profiles</h2>
      <p class="muted small">
        Measured when a model becomes ready (or typed in); the pre-load check and cluster placement read them.
      </p>
      <table class="profiles">
        <thead>
          <tr>
            <th>Model</th>
            <th>GPU</th>
            <th>Max tokens</th>
            <th>TP</th>
            <th>Total</th>
            <th>Weights</th>
            <th>KV cache</th>
            <th>CUDA graphs</th>
            <th>Utilization</th>
            <th>Source</th>
            {canWrite.value && <th />}
          </tr>
        </thead>
        <tbody>
          {list?.length === 0 && (
            <tr>
              <td colSpan={11} class="muted">
                No profile yet: one is recorded when a load becomes ready.
              </td>
            </tr>
          )}
          {list?.map((p) => (
            <tr key={p.id} data-profile={p.id}>
              <td>
                {p.model_path}
                <div class="muted small">{p.profile_name}</div>
              </td>
              <td>
                {p.gpu_name} <span class="muted small">{gib(p.gpu_total_memory_gib)}</span>
              </td>
              <td>{p.max_tokens}</td>
              <td>{p.tensor_parallel_size}</td>
              <td data-figure="total">{gib(p.total_gpu_memory_gib, 2)}</td>
              <td>{gib(p.weights_memory_gib, 2)}</td>
              <td>{gib(p.kv_cache_available_gib, 2)}</td>
              <td>{gib(p.cuda_graphs_gib, 2)}</td>
              <td>{p.gpu_memory_utilization ?? '—'}</td>
              <td title={p.created_at}>
                {p.source} · {since(p.created_at)}
              </td>
              {canWrite.value && (
                <td>
                  <button type="button" class="danger" onClick={() => remove(p.id)}>
                    Delete profile
                  </button>
                </td>
              )}
            </tr>
          ))}
        </tbody>
      </table>
      <ErrorNote error={error} />
    </section>
  )
}

export function PresetsPage() {
  return (
    <div class="page">
      <Presets />
      <Profiles />
    </div>
  )
}
