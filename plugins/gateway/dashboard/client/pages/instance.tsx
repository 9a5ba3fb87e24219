import { Fragment } from 'preact'
import { gib, since } from '../../../../../src/dashboard/client/format.ts'
import { href } from '../../../../../src/dashboard/client/router.ts'
import { canWrite } from '../../../../../src/dashboard/client/session.ts'
import { InstanceActions } from '../components/instance-actions.tsx'
import { LogView } from '../components/log-view.tsx'
import { MovePanel, MoveProgress, startedMoves } from '../components/move-panel.tsx'
import { StatusBadge, Swatch } from '../components/status.tsx'
import { colors, instances, operations } from '../live.ts'
import type { InstanceRecord } from '../types.ts'
import { InstanceProgress } from './models.tsx'

/** InstancePage: one instance: its state live, its memory figures, its actions (admins) and its log. */
function MemoryFigures({ instance }: { instance: InstanceRecord }) {
  const m = instance.memory_metrics
  const baseline = instance.memory_baseline_by_gpu
  const held = instance.memory_gib_by_gpu
  return (
    <section class="card">
      <h3>Memory</h3>
      {!m && !baseline && !held && <p class="muted">Measured when the engine is ready.</p>}
      <dl class="figures">
        {held &&
          Object.entries(held).map(([g, v]) => (
            <Fragment key={g}>
              <dt>holds on GPU {g} now</dt>
              <dd data-gpu={g}>{gib(v, 2)}</dd>
            </Fragment>
          ))}
        {baseline &&
          Object.entries(baseline).map(([g, v]) => (
            <Fragment key={g}>
              <dt>footprint on GPU {g} at readiness</dt>
              <dd data-baseline-gpu={g}>{gib(v, 2)}</dd>
            </Fragment>
          ))}
        {m && (
          <>
            <dt>weights</dt>
            <dd>{gib(m.weights_memory_gib, 2)}</dd>
            <dt>CUDA graphs</dt>
            <dd>{gib(m.cuda_graph_memory_gib, 2)}</dd>
            <dt>overhead</dt>
            <dd>{gib(m.overhead_memory_gib, 2)}</dd>
            <dt>KV cache</dt>
            <dd>{gib(m.kv_cache_available_gib, 2)}</dd>
            <dt>KV per request</dt>
            <dd>{m.kv_cache_per_request_mib.toFixed(0)} MiB</dd>
            <dt>max model length</dt>
            <dd>{m.max_model_len} tokens</dd>
          </>
        )}
      </dl>
    </section>
  )
}

function Details({ instance: i }: { instance: InstanceRecord }) {
  return (
    <section class="card">
      <dl class="figures">
        <dt>model path</dt>
        <dd>{i.model_path}</dd>
        <dt>GPUs</dt>
        <dd>
          {i.gpu_ids.join(', ')} (tensor parallel {i.tensor_parallel_size})
        </dd>
        <dt>port · pid</dt>
        <dd>
          {i.port} · {i.process_id ?? '—'}
        </dd>
        <dt>context length</dt>
        <dd>{i.max_tokens ?? '—'}</dd>
        <dt>sleep mode</dt>
        <dd>
          {i.enable_sleep_mode ? 'on' : 'off'}
          {i.status === 'sleeping' && ` · asleep at level ${i.sleep_level ?? '?'} since ${since(i.slept_at)}`}
        </dd>
        <dt>loaded · ready</dt>
        <dd>
          {since(i.loaded_at)} · {i.ready_at ? since(i.ready_at) : 'not yet'}
        </dd>
        <dt>command</dt>
        <dd>
          <code class="command">{i.launch_command}</code>
        </dd>
      </dl>
      {i.error && <p class="error">{i.error}</p>}
    </section>
  )
}

export function InstancePage({ params }: { params: Record<string, string> }) {
  const id = params.id ?? ''
  const instance = instances.value.get(id)
  const started = startedMoves.value.get(id)
  if (!instance)
    return (
      <div class="page">
        {started ? (
          <section class="card">
            <MoveProgress started={started} />
          </section>
        ) : (
          <p class="muted">No instance {id} on this gateway (any more).</p>
        )}
        <a href={href('/models')}>All models</a>
      </div>
    )
  return (
    <div class="page instance" data-instance={id}>
      <h2 class="instance-title">
        <Swatch color={colors.value.get(id)} /> {instance.served_model_name}{' '}
        <StatusBadge status={instance.status} operation={operations.value.get(id)} />
      </h2>
      <InstanceProgress instance={instance} />
      {canWrite.value && <InstanceActions instance={instance} />}
      <div class="columns">
        <Details instance={instance} />
        <MemoryFigures instance={instance} />
      </div>
      {canWrite.value && <MovePanel instance={instance} />}
      <LogView instanceId={id} />
    </div>
  )
}
