import { ProgressBar } from '../../../../../src/dashboard/client/components/progress.tsx'
import { gib, since } from '../../../../../src/dashboard/client/format.ts'
import { href } from '../../../../../src/dashboard/client/router.ts'
import { canWrite } from '../../../../../src/dashboard/client/session.ts'
import { LoadForm } from '../components/load-form.tsx'
import { StatusBadge, Swatch } from '../components/status.tsx'
import { colors, operations, progress, sortedInstances } from '../live.ts'
import type { InstanceRecord } from '../types.ts'

/** ModelsPage: every instance with its state, GPUs, port and memory, and (for admins) the load form. */
/** footprint: what the instance holds on all its GPUs now (the gateway's one figure of it, in its state). */
function footprint(i: InstanceRecord): number | null {
  const held = i.memory_gib_by_gpu
  return held ? Object.values(held).reduce((a, v) => a + v, 0) : null
}

/** InstanceProgress: the load's (or a wake's) progress bar while it runs. */
export function InstanceProgress({ instance }: { instance: InstanceRecord }) {
  const p = progress.value.get(instance.id)
  const waking = operations.value.get(instance.id) === 'wake'
  const loading = instance.status === 'starting' && p?.phase !== 'waking'
  if (!p || !(loading || (waking && p.phase === 'waking'))) return null
  return <ProgressBar percent={p.percent} label={p.phase.replaceAll('_', ' ')} />
}

export function ModelsPage() {
  const list = sortedInstances.value
  return (
    <div class="page">
      <table class="instances">
        <thead>
          <tr>
            <th>Model</th>
            <th>Status</th>
            <th>GPUs</th>
            <th>Port</th>
            <th>Memory</th>
            <th>Loaded</th>
          </tr>
        </thead>
        <tbody>
          {list.length === 0 && (
            <tr>
              <td colSpan={6} class="muted">
                No model is loaded.
              </td>
            </tr>
          )}
          {list.map((i) => (
            <tr key={i.id} data-instance={i.id} data-status={i.status}>
              <td>
                <Swatch color={colors.value.get(i.id)} />
                <a href={href(`/models/${i.id}`)}>{i.served_model_name}</a>
                <div class="muted small">{i.id}</div>
              </td>
              <td>
                <StatusBadge status={i.status} operation={operations.value.get(i.id)} />
                <InstanceProgress instance={i} />
                {i.error && <div class="error small">{i.error}</div>}
              </td>
              <td>{i.gpu_ids.join(', ')}</td>
              <td>{i.port}</td>
              <td>{gib(footprint(i))}</td>
              <td title={i.loaded_at}>{since(i.loaded_at)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {canWrite.value && <LoadForm />}
    </div>
  )
}
