import { useEffect, useState } from 'preact/hooks'
import { ErrorNote } from '../../../../../src/dashboard/client/components/error-note.tsx'
import { gib, since } from '../../../../../src/dashboard/client/format.ts'
import { canWrite } from '../../../../../src/dashboard/client/session.ts'
import { type ApiError, api } from '../api.ts'
import { CatalogForm } from '../components/catalog-form.tsx'
import { catalogChanges, instances, residencyChanges } from '../live.ts'
import type { CatalogEntry, Residency, ResidencyDecision, ResidencyModel } from '../types.ts'

/**
 * CatalogPage: the models this host may serve on demand, with where each comes from (the YAML or
 * the API), pin and preload, and, where the residency manager runs (GET /api/residency answers),
 * each one's state here and the manager's recent decisions: what was slept or unloaded to make
 * room for what, and what was passed over and why. Where it does not run (404) the page shows the
 * catalogue alone. Both are refetched when the event stream says they changed (a catalogue change,
 * a decision, an instance's change), never on a timer. Admins add, edit and remove the API's
 * entries; the YAML's are changed in the YAML.
 */
function useCatalog() {
  const [entries, setEntries] = useState<CatalogEntry[] | null>(null)
  const [error, setError] = useState<ApiError | null>(null)
  const refresh = () =>
    api
      .catalog()
      .then((r) => {
        setEntries(r.entries)
        setError(null)
      })
      .catch(setError)
  // Read again whenever the stream reports a catalogue change.
  const changes = catalogChanges.value
  useEffect(() => {
    void refresh()
  }, [changes])
  return { entries, error, refresh }
}

/** useResidency: the manager's view (null: no manager here; undefined: not read yet). */
function useResidency() {
  const [residency, setResidency] = useState<Residency | null | undefined>(undefined)
  const [error, setError] = useState<ApiError | null>(null)
  // Read again whenever the stream reports a decision, a catalogue change or an instance's change.
  const changes = [residencyChanges.value, catalogChanges.value, instances.value]
  useEffect(() => {
    api
      .residency()
      .then((r) => {
        setResidency(r)
        setError(null)
      })
      .catch(setError)
  }, changes)
  return { residency, error }
}

const yes = (b: boolean) => (b ? 'yes' : 'no')

type Action = ResidencyDecision['victims'][number]['action']
/** DONE / CONSIDERED: a decision's action as what was done to a victim, or weighed for a candidate. */
const DONE: Record<Action, string> = {
  sleep1: 'slept at level 1',
  sleep2: 'slept at level 2',
  unload: 'unloaded',
}
const CONSIDERED: Record<Action, string> = {
  sleep1: 'sleep at level 1',
  sleep2: 'sleep at level 2',
  unload: 'unload',
}

function StateCell({ model }: { model: ResidencyModel | undefined }) {
  if (!model) return <td data-figure="state">—</td>
  return (
    <td data-figure="state" title={model.why_not_evictable ?? 'may be evicted now'}>
      {model.state}
      {model.instance_id && <div class="muted small">{model.instance_id}</div>}
      <div class="muted small">
        {model.request_rate_per_min}/min · {model.queue_length} queued · {gib(model.footprint_gib)}
      </div>
    </td>
  )
}

function EntryRow(props: {
  e: CatalogEntry
  state: ResidencyModel | undefined
  showState: boolean
  onEdit: () => void
  onRemove: () => void
}) {
  const { e } = props
  const options = [
    e.max_tokens !== null ? `context ${e.max_tokens}` : null,
    e.gpu_memory_utilization !== null ? `share ${e.gpu_memory_utilization}` : null,
    e.enable_sleep_mode ? 'sleep mode' : null,
    e.extra_args.length ? e.extra_args.join(' ') : null,
  ].filter(Boolean)
  return (
    <tr data-entry={e.name} data-source={e.source} data-state={props.state?.state ?? ''}>
      <td>{e.name}</td>
      <td>
        {e.model_path}
        {options.length > 0 && <div class="muted small">{options.join(' · ')}</div>}
      </td>
      <td data-figure="gpus">
        {e.gpu_ids ? `GPU ${e.gpu_ids.join(', ')}` : 'any'} · TP {e.tensor_parallel_size}
      </td>
      <td data-figure="source" title={e.updated_at ?? undefined}>
        {e.source === 'config' ? 'YAML' : `API · ${since(e.updated_at)}`}
      </td>
      <td data-figure="pin">{yes(e.pin)}</td>
      <td data-figure="preload">{yes(e.preload)}</td>
      {props.showState && <StateCell model={props.state} />}
      {canWrite.value && (
        <td>
          {e.source === 'api' ? (
            <div class="actions">
              <button type="button" onClick={props.onEdit}>
                Edit entry
              </button>
              <button type="button" class="danger" onClick={props.onRemove}>
                Remove entry
              </button>
            </div>
          ) : (
            <span class="muted small">changed in the YAML</span>
          )}
        </td>
      )}
    </tr>
  )
}

function Decision({ d }: { d: ResidencyDecision }) {
  const t = d.trigger
  return (
    <li data-decision={d.at}>
      <strong>
        {t.kind} {t.model}
      </strong>{' '}
      {t.kind === 'idle' ? 'slept by the idle rule' : `needed ${gib(t.need_gib)}`} on GPU{' '}
      {t.gpu_ids.join(', ') || '—'} <span class="muted small">{since(d.at)}</span>
      <div>{d.reason}</div>
      {d.victims.map((v) => (
        <div key={v.instance_id} class="small" data-victim={v.model}>
          {v.model} ({v.instance_id}) {DONE[v.action]}: freed {gib(v.freed_gib)}, expected cost to bring it
          back {v.expected_cost_s} s
        </div>
      ))}
      {d.rejected.map((r) => (
        <div key={`${r.instance_id}-${r.action}`} class="muted small" data-rejected={r.model}>
          passed over {r.model}
          {r.action ? ` (${CONSIDERED[r.action]})` : ''}: {r.reason}
        </div>
      ))}
    </li>
  )
}

export function CatalogPage() {
  const { entries, error, refresh } = useCatalog()
  const { residency, error: residencyError } = useResidency()
  const [editing, setEditing] = useState<CatalogEntry | null>(null)
  const [rowError, setRowError] = useState<{ name: string; error: ApiError } | null>(null)
  const states = new Map((residency?.models ?? []).map((m) => [m.name, m]))
  const showState = !!residency
  const remove = async (name: string) => {
    setRowError(null)
    try {
      await api.deleteCatalogEntry(name)
      if (editing?.name === name) setEditing(null)
      await refresh()
    } catch (err) {
      setRowError({ name, error: err as ApiError })
    }
  }
  return (
    <div class="page">
      <section class="card">
        <h2>Models served on demand</h2>
        <p class="muted small">
          Models this host may serve on demand: a request naming one loads it, making room by the residency
          policy. Entries from the YAML (plugins.gateway.catalog) are changed there.
        </p>
        {residency && (
          <p class="residency-summary" data-policy={residency.policy}>
            Policy <strong>{residency.policy}</strong>
            {residency.active ? '' : ' (idle)'} · host memory {gib(residency.host_memory.used_gib)} of{' '}
            {gib(residency.host_memory.budget_gib)}
          </p>
        )}
        <table class="catalog">
          <thead>
            <tr>
              <th>Name</th>
              <th>Model</th>
              <th>GPUs</th>
              <th>Source</th>
              <th>Pin</th>
              <th>Preload</th>
              {showState && <th>State</th>}
              {canWrite.value && <th />}
            </tr>
          </thead>
          <tbody>
            {entries?.length === 0 && (
              <tr>
                <td colSpan={8} class="muted">
                  The catalogue is empty.
                </td>
              </tr>
            )}
            {entries?.map((e) => (
              <EntryRow
                key={e.name}
                e={e}
                state={states.get(e.name)}
                showState={showState}
                onEdit={() => setEditing(e)}
                onRemove={() => remove(e.name)}
              />
            ))}
          </tbody>
        </table>
        {rowError && <ErrorNote error={rowError.error} />}
        <ErrorNote error={error ?? residencyError} />
      </section>
      {canWrite.value && (
        <CatalogForm
          key={editing?.name ?? ''}
          editing={editing}
          onSaved={() => void refresh()}
          onCancel={() => setEditing(null)}
        />
      )}
      {residency && (
        <section class="card">
          <h2>Recent decisions</h2>
          {residency.decisions.length === 0 ? (
            <p class="muted">Nothing has been slept or unloaded to make room yet.</p>
          ) : (
            <ol class="decisions">
              {residency.decisions.map((d) => (
                <Decision key={`${d.at}-${d.trigger.model}`} d={d} />
              ))}
            </ol>
          )}
        </section>
      )}
    </div>
  )
}
