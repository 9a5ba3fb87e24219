import { useState } from 'preact/hooks'
import { ErrorNote } from '../../../../../src/dashboard/client/components/error-note.tsx'
import { gib, ms } from '../../../../../src/dashboard/client/format.ts'
import { navigate } from '../../../../../src/dashboard/client/router.ts'
import { type ApiError, api } from '../api.ts'
import { operations } from '../live.ts'
import type { InstanceRecord, SleepLevel, SleepResult, WakeResult } from '../types.ts'

/**
 * InstanceActions: sleep (with its level), wake and unload, for admins. Each shows what it did or
 * the server's refusal beside its button; a button is offered only in the states that accept it.
 */
type Outcome = { kind: 'sleep'; result: SleepResult } | { kind: 'wake'; result: WakeResult } | null

function SleepOutcome({ outcome }: { outcome: Outcome }) {
  if (!outcome) return null
  if (outcome.kind === 'wake')
    return (
      <p class="note" role="status">
        Woke ({outcome.result.phases.join(' → ') || 'wake_up'}).
      </p>
    )
  const r = outcome.result
  const freed = Object.entries(r.memory_check.gpus)
    .map(([g, c]) => `GPU ${g}: freed ${gib(c.freed_gib, 2)}`)
    .join(', ')
  return (
    <p class={`note ${r.sleep_verified === false ? 'warn' : ''}`} role="status">
      Asleep at level {r.sleep_level}
      {r.drained_requests > 0 && ` after draining ${r.drained_requests} requests (${ms(r.drain_ms)})`}.{' '}
      {r.sleep_verified === true && `Verified: ${freed}.`}
      {r.sleep_verified === false && `Not verified: ${r.memory_check.reason ?? freed}.`}
      {r.sleep_verified === null &&
        `Not measured${r.memory_check.reason ? `: ${r.memory_check.reason}` : ''}.`}
    </p>
  )
}

export function InstanceActions({ instance }: { instance: InstanceRecord }) {
  const [level, setLevel] = useState<SleepLevel>(1)
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<ApiError | null>(null)
  const [outcome, setOutcome] = useState<Outcome>(null)
  const [confirmUnload, setConfirmUnload] = useState(false)
  const op = operations.value.get(instance.id)
  const run = async (fn: () => Promise<Outcome | undefined>) => {
    setBusy(true)
    setError(null)
    try {
      const o = await fn()
      if (o !== undefined) setOutcome(o)
    } catch (err) {
      setError(err as ApiError)
    } finally {
      setBusy(false)
    }
  }
  const idle = !busy && !op
  const canSleep = instance.status === 'active' && instance.enable_sleep_mode
  return (
    <section class="card actions-card">
      <h3>Actions</h3>
      <div class="actions">
        {canSleep && (
          <>
            <select
              name="sleep-level"
              aria-label="Sleep level"
              value={String(level)}
              onChange={(e) => setLevel(Number(e.currentTarget.value) as SleepLevel)}
            >
              <option value="1">level 1: weights to CPU memory</option>
              <option value="2">level 2: discard weights</option>
            </select>
            <button
              type="button"
              disabled={!idle}
              onClick={() =>
                run(async () => ({ kind: 'sleep', result: await api.sleep(instance.id, level) }))
              }
            >
              Sleep
            </button>
          </>
        )}
        {instance.status === 'active' && !instance.enable_sleep_mode && (
          <span class="muted">Loaded without sleep mode: it cannot sleep.</span>
        )}
        {instance.status === 'sleeping' && (
          <button
            type="button"
            disabled={!idle}
            onClick={() => run(async () => ({ kind: 'wake', result: await api.wake(instance.id) }))}
          >
            Wake
          </button>
        )}
        {instance.status !== 'stopping' && !confirmUnload && (
          <button type="button" class="danger" disabled={busy} onClick={() => setConfirmUnload(true)}>
            Unload
          </button>
        )}
        {confirmUnload && (
          <>
            <button
              type="button"
              class="danger"
              disabled={busy}
              onClick={() =>
                run(async () => {
                  await api.unload(instance.id)
                  navigate('/models')
                  return undefined
                })
              }
            >
              Confirm unload
            </button>
            <button type="button" onClick={() => setConfirmUnload(false)}>
              Keep it
            </button>
          </>
        )}
      </div>
      <SleepOutcome outcome={outcome} />
      <ErrorNote error={error} />
    </section>
  )
}
