import { signal } from '@preact/signals'
import { useState } from 'preact/hooks'
import { ErrorNote } from '../../../../../src/dashboard/client/components/error-note.tsx'
import { ProgressBar } from '../../../../../src/dashboard/client/components/progress.tsx'
import { gib } from '../../../../../src/dashboard/client/format.ts'
import { href } from '../../../../../src/dashboard/client/router.ts'
import { type ApiError, api } from '../api.ts'
import { instances, memory, moves } from '../live.ts'
import type { InstanceRecord, MovePhase, MoveRecord } from '../types.ts'

/**
 * MovePanel: move an instance to other GPUs (blue-green), follow the move through its phases (live,
 * from the dashboard's event stream), and cancel it gracefully or by force while that is possible.
 */
const PHASES: MovePhase[] = ['validating', 'spawning', 'switching', 'draining', 'completing', 'completed']
const CANCELLABLE = new Set<MovePhase>(['validating', 'spawning', 'switching', 'draining'])

/** StartedMove: a move started from this page, kept by source instance (it outlives the source). */
export interface StartedMove {
  record: MoveRecord
  servedName: string
}
export const startedMoves = signal<ReadonlyMap<string, StartedMove>>(new Map())

export function MoveProgress({
  started,
  onCancel,
}: {
  started: StartedMove
  onCancel?: (force: boolean) => void
}) {
  const move = started.record
  const live = moves.value.get(move.move_id)
  const phase = live?.phase ?? move.phase
  const reached = PHASES.indexOf(phase)
  const target = [...instances.value.values()].find(
    (i) =>
      i.id !== move.instance_id &&
      i.served_model_name === started.servedName &&
      i.gpu_ids.join() === move.target_gpu_ids.join(),
  )
  return (
    <div class="move" data-phase={phase}>
      <ol class="phases">
        {PHASES.map((p, i) => (
          <li key={p} class={p === phase ? 'current' : i < reached || phase === 'completed' ? 'done' : ''}>
            {p}
          </li>
        ))}
      </ol>
      {phase === 'spawning' && <ProgressBar percent={live?.progress ?? 0} label="target loading" />}
      <p class={phase === 'failed' ? 'error' : 'muted'}>
        {phase === 'failed'
          ? `Move failed: ${live?.error ?? move.error ?? 'rolled back'}`
          : (live?.message ?? move.message)}
      </p>
      {phase === 'completed' && target && (
        <p>
          Now served by <a href={href(`/models/${target.id}`)}>{target.id}</a> on GPUs{' '}
          {target.gpu_ids.join(', ')}.
        </p>
      )}
      {CANCELLABLE.has(phase) && onCancel && (
        <div class="actions">
          <button type="button" onClick={() => onCancel(false)}>
            Cancel move
          </button>
          {(phase === 'switching' || phase === 'draining') && (
            <button type="button" class="danger" onClick={() => onCancel(true)}>
              Force completion
            </button>
          )}
        </div>
      )}
    </div>
  )
}

export function MovePanel({ instance }: { instance: InstanceRecord }) {
  const [targets, setTargets] = useState<number[]>([])
  const [drainSeconds, setDrainSeconds] = useState('60')
  const started = startedMoves.value.get(instance.id)
  const move = started?.record
  const [error, setError] = useState<ApiError | null>(null)
  const [busy, setBusy] = useState(false)
  const need = instance.tensor_parallel_size
  const movable = instance.status === 'active' || instance.status === 'sleeping'
  const act = async (fn: () => Promise<void>) => {
    setBusy(true)
    setError(null)
    try {
      await fn()
    } catch (err) {
      setError(err as ApiError)
    } finally {
      setBusy(false)
    }
  }
  const start = () =>
    act(async () => {
      const seconds = Number(drainSeconds)
      const record = await api.move(
        instance.id,
        [...targets].sort((a, b) => a - b),
        Math.round(seconds * 1000),
      )
      startedMoves.value = new Map(startedMoves.value).set(instance.id, {
        record,
        servedName: instance.served_model_name,
      })
    })
  const cancel = (force: boolean) => act(() => api.cancelMove(move!.move_id, force))
  const toggle = (g: number) =>
    setTargets(targets.includes(g) ? targets.filter((t) => t !== g) : [...targets, g])
  return (
    <section class="card move-card">
      <h3>Move to other GPUs</h3>
      {started && <MoveProgress started={started} onCancel={cancel} />}
      {movable && !(move && CANCELLABLE.has(moves.value.get(move.move_id)?.phase ?? move.phase)) && (
        <div class="actions">
          {(memory.value?.gpus ?? [])
            .filter((g) => !instance.gpu_ids.includes(g.gpu_index))
            .map((g) => (
              <label class="inline" key={g.gpu_index}>
                <input
                  type="checkbox"
                  name={`move-gpu-${g.gpu_index}`}
                  checked={targets.includes(g.gpu_index)}
                  onChange={() => toggle(g.gpu_index)}
                />
                GPU {g.gpu_index} <span class="muted">({gib(g.free_gb)} free)</span>
              </label>
            ))}
          <label class="inline">
            drain up to
            <input
              class="short"
              name="drain-seconds"
              type="number"
              min={0}
              value={drainSeconds}
              onInput={(e) => setDrainSeconds(e.currentTarget.value)}
            />
            s
          </label>
          <button type="button" disabled={busy || targets.length !== need} onClick={start}>
            Move
          </button>
          {targets.length !== need && (
            <span class="muted">
              choose {need} GPU{need > 1 ? 's' : ''}
            </span>
          )}
        </div>
      )}
      <ErrorNote error={error} />
    </section>
  )
}
