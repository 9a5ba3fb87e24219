import { useRef, useState } from 'preact/hooks'
import { ErrorNote } from '../../../../../src/dashboard/client/components/error-note.tsx'
import { gib, splitArgs } from '../../../../../src/dashboard/client/format.ts'
import { type ApiError, api } from '../api.ts'
import { instances, memory } from '../live.ts'
import type { CheckResult, LoadRequest } from '../types.ts'

/**
 * LoadForm: load a model. The first press runs the pre-load check (the memory profile against the
 * target GPUs' free memory) and shows its verdict with the figures; only then does the button load,
 * with the same fields (any change asks for a new check). A `danger` verdict loads only when the
 * operator presses "Load anyway" (the load's `force`).
 */
interface Fields {
  model: string
  auto: boolean
  gpuIds: number[]
  tp: string
  maxTokens: string
  sleep: boolean
  extraArgs: string
  servedName: string
  utilization: string
}

const EMPTY: Fields = {
  model: '',
  auto: true,
  gpuIds: [],
  tp: '1',
  maxTokens: '',
  sleep: true,
  extraArgs: '',
  servedName: '',
  utilization: '',
}

const num = (s: string) => (s.trim() === '' ? undefined : Number(s))

function request(f: Fields): LoadRequest {
  const tp = f.auto ? num(f.tp) : f.gpuIds.length
  const body: LoadRequest = { model_path: f.model.trim(), enable_sleep_mode: f.sleep }
  if (!f.auto) body.gpu_ids = [...f.gpuIds].sort((a, b) => a - b)
  if (tp !== undefined) body.tensor_parallel_size = tp
  const maxTokens = num(f.maxTokens)
  if (maxTokens !== undefined) body.max_tokens = maxTokens
  const args = splitArgs(f.extraArgs)
  if (args.length) body.extra_args = args
  if (f.servedName.trim()) body.served_model_name = f.servedName.trim()
  const util = num(f.utilization)
  if (util !== undefined) body.gpu_memory_utilization = util
  return body
}

function CheckVerdict({ result }: { result: CheckResult }) {
  return (
    <div class={`check ${result.warning_level}`} data-level={result.warning_level} role="status">
      <strong>{result.warning_level}</strong> {result.message}
      <dl class="figures">
        <dt>needs per GPU</dt>
        <dd>{gib(result.estimated_memory_gib, 2)}</dd>
        <dt>free on the least free target</dt>
        <dd>{gib(result.available_memory_gib, 2)}</dd>
        <dt>target GPUs</dt>
        <dd>
          {result.gpu_ids.join(', ') || '—'}{' '}
          {result.gpu_name && `(${result.gpu_name}, ${gib(result.gpu_total_memory_gib)})`}
        </dd>
      </dl>
    </div>
  )
}

export function LoadForm() {
  const [f, setF] = useState<Fields>(EMPTY)
  const [checked, setChecked] = useState<{ key: string; result: CheckResult } | null>(null)
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<ApiError | null>(null)
  const [started, setStarted] = useState<{ id: string; text: string } | null>(null)
  // The "Loading …" line lasts as long as the load: until its instance, once listed, is no longer
  // starting (active, failed or gone; the table shows which).
  const listed = useRef(false)
  const startedInstance = started ? instances.value.get(started.id) : undefined
  if (startedInstance) listed.current = true
  const loading = started && (startedInstance ? startedInstance.status === 'starting' : !listed.current)
  const set = (patch: Partial<Fields>) => setF({ ...f, ...patch })
  const body = request(f)
  const key = JSON.stringify(body)
  const current = checked?.key === key ? checked.result : null
  const gpuList = memory.value?.gpus ?? []

  const submit = async (e: Event) => {
    e.preventDefault()
    setBusy(true)
    setError(null)
    try {
      if (!current) {
        const { gpu_ids, tensor_parallel_size, max_tokens, gpu_memory_utilization } = body
        const result = await api.check({
          model_path: body.model_path,
          ...(gpu_ids ? { gpu_ids } : {}),
          ...(tensor_parallel_size ? { tensor_parallel_size } : {}),
          ...(max_tokens ? { max_tokens } : {}),
          ...(gpu_memory_utilization ? { gpu_memory_utilization } : {}),
        })
        setChecked({ key, result })
      } else {
        const res = await api.load(current.warning_level === 'danger' ? { ...body, force: true } : body)
        listed.current = false
        setStarted({
          id: res.instance_id,
          text: `Loading ${res.model} as ${res.instance_id} on port ${res.port}`,
        })
        setChecked(null)
        setF(EMPTY)
      }
    } catch (err) {
      setError(err as ApiError)
    } finally {
      setBusy(false)
    }
  }

  const toggleGpu = (i: number) =>
    set({ gpuIds: f.gpuIds.includes(i) ? f.gpuIds.filter((g) => g !== i) : [...f.gpuIds, i] })
  const label = !current ? 'Check memory' : current.warning_level === 'danger' ? 'Load anyway' : 'Load model'

  return (
    <form class="card load-form" onSubmit={submit} aria-label="Load a model">
      <h3>Load a model</h3>
      <label>
        Model path
        <input
          name="model_path"
          required
          placeholder="Qwen/Qwen2.5-7B-Instruct or /models/llama"
          value={f.model}
          onInput={(e) => set({ model: e.currentTarget.value })}
        />
      </label>
      <fieldset class="gpu-choice">
        <legend>GPUs</legend>
        <label class="inline">
          <input type="checkbox" name="auto" checked={f.auto} onChange={() => set({ auto: !f.auto })} />
          automatic (most free memory)
        </label>
        {!f.auto &&
          gpuList.map((g) => (
            <label class="inline" key={g.gpu_index}>
              <input
                type="checkbox"
                name={`gpu-${g.gpu_index}`}
                checked={f.gpuIds.includes(g.gpu_index)}
                onChange={() => toggleGpu(g.gpu_index)}
              />
              GPU {g.gpu_index} <span class="muted">({gib(g.free_gb)} free)</span>
            </label>
          ))}
      </fieldset>
      <div class="row">
        <label>
          Tensor parallel
          <input
            name="tensor_parallel_size"
            type="number"
            min={1}
            disabled={!f.auto}
            value={f.auto ? f.tp : String(f.gpuIds.length)}
            onInput={(e) => set({ tp: e.currentTarget.value })}
          />
        </label>
        <label>
          Context length
          <input
            name="max_tokens"
            type="number"
            min={1}
            placeholder="model's maximum"
            value={f.maxTokens}
            onInput={(e) => set({ maxTokens: e.currentTarget.value })}
          />
        </label>
        <label>
          GPU memory share
          <input
            name="gpu_memory_utilization"
            type="number"
            min={0.05}
            max={1}
            step={0.01}
            placeholder="default"
            value={f.utilization}
            onInput={(e) => set({ utilization: e.currentTarget.value })}
          />
        </label>
      </div>
      <div class="row">
        <label>
          Served name
          <input
            name="served_model_name"
            placeholder="the model path"
            value={f.servedName}
            onInput={(e) => set({ servedName: e.currentTarget.value })}
          />
        </label>
        <label class="wide">
          Extra engine arguments
          <input
            name="extra_args"
            placeholder="--dtype bfloat16 --enforce-eager"
            value={f.extraArgs}
            onInput={(e) => set({ extraArgs: e.currentTarget.value })}
          />
        </label>
      </div>
      <label class="inline">
        <input
          type="checkbox"
          name="enable_sleep_mode"
          checked={f.sleep}
          onChange={() => set({ sleep: !f.sleep })}
        />
        sleep mode (the model can be put to sleep later)
      </label>
      {current && <CheckVerdict result={current} />}
      <div class="actions">
        <button
          type="submit"
          class={!current ? '' : current.warning_level === 'danger' ? 'primary danger' : 'primary'}
          disabled={busy || !f.model.trim() || (!f.auto && !f.gpuIds.length)}
        >
          {busy ? 'Working…' : label}
        </button>
        {loading && !current && (
          <span class="muted" data-loading={started.id}>
            {started.text}
          </span>
        )}
      </div>
      <ErrorNote error={error} />
    </form>
  )
}
