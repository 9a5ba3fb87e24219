import { useState } from 'preact/hooks'
import { ErrorNote } from '../../../../../src/dashboard/client/components/error-note.tsx'
import { splitArgs } from '../../../../../src/dashboard/client/format.ts'
import { type ApiError, api } from '../api.ts'
import type { CatalogEntry, CatalogEntryFields } from '../types.ts'

/**
 * CatalogForm: add a catalogue entry, or edit one saved through the API (its name fixed: another
 * name is another entry). Empty fields are left out, so the gateway applies its defaults. The
 * server's refusal (a name that is a path, an entry too large for this host with its figures) is
 * shown under the form as it came; a save without a GPU probe shows the server's warning.
 */
interface Fields {
  name: string
  modelPath: string
  tp: string
  gpuIds: string
  maxTokens: string
  utilization: string
  extraArgs: string
  sleep: boolean
  pin: boolean
  preload: boolean
}

const EMPTY: Fields = {
  name: '',
  modelPath: '',
  tp: '',
  gpuIds: '',
  maxTokens: '',
  utilization: '',
  extraArgs: '',
  sleep: true,
  pin: false,
  preload: false,
}

function fieldsOf(e: CatalogEntry): Fields {
  return {
    name: e.name,
    modelPath: e.model_path,
    tp: String(e.tensor_parallel_size),
    gpuIds: e.gpu_ids?.join(', ') ?? '',
    maxTokens: e.max_tokens === null ? '' : String(e.max_tokens),
    utilization: e.gpu_memory_utilization === null ? '' : String(e.gpu_memory_utilization),
    extraArgs: e.extra_args.map((a) => (/\s/.test(a) ? `"${a}"` : a)).join(' '),
    sleep: e.enable_sleep_mode,
    pin: e.pin,
    preload: e.preload,
  }
}

/** INPUT_NAMES: each text field's input is named after the body field it fills. */
const INPUT_NAMES: Record<string, string> = {
  name: 'name',
  modelPath: 'model_path',
  tp: 'tensor_parallel_size',
  gpuIds: 'gpu_ids',
  maxTokens: 'max_tokens',
  utilization: 'gpu_memory_utilization',
  extraArgs: 'extra_args',
}

const num = (s: string) => (s.trim() === '' ? undefined : Number(s))

function body(f: Fields): CatalogEntryFields {
  const b: CatalogEntryFields = {
    model_path: f.modelPath.trim(),
    enable_sleep_mode: f.sleep,
    pin: f.pin,
    preload: f.preload,
  }
  const tp = num(f.tp)
  if (tp !== undefined) b.tensor_parallel_size = tp
  const gpus = f.gpuIds.split(/[\s,]+/).filter(Boolean)
  if (gpus.length) b.gpu_ids = gpus.map(Number)
  const maxTokens = num(f.maxTokens)
  if (maxTokens !== undefined) b.max_tokens = maxTokens
  const util = num(f.utilization)
  if (util !== undefined) b.gpu_memory_utilization = util
  const args = splitArgs(f.extraArgs)
  if (args.length) b.extra_args = args
  return b
}

export function CatalogForm(props: {
  editing: CatalogEntry | null
  onSaved: () => void
  onCancel: () => void
}) {
  const [f, setF] = useState<Fields>(props.editing ? fieldsOf(props.editing) : EMPTY)
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<ApiError | null>(null)
  const [saved, setSaved] = useState<{ text: string; warning?: string | undefined } | null>(null)
  const set = (patch: Partial<Fields>) => setF({ ...f, ...patch })
  const text = (key: keyof Fields) => ({
    name: INPUT_NAMES[key],
    value: f[key] as string,
    onInput: (e: Event) => set({ [key]: (e.currentTarget as HTMLInputElement).value }),
  })
  const check = (key: 'sleep' | 'pin' | 'preload') => ({
    type: 'checkbox' as const,
    checked: f[key],
    onChange: () => set({ [key]: !f[key] }),
  })

  const submit = async (e: Event) => {
    e.preventDefault()
    setBusy(true)
    setError(null)
    setSaved(null)
    try {
      const r = await api.saveCatalogEntry(f.name.trim(), body(f))
      setSaved({ text: `Saved ${r.name}`, warning: r.warning })
      if (!props.editing) setF(EMPTY)
      props.onSaved()
    } catch (err) {
      setError(err as ApiError)
    } finally {
      setBusy(false)
    }
  }

  return (
    <form class="card catalog-form" onSubmit={submit} aria-label="Catalogue entry">
      <h3>{props.editing ? `Edit ${props.editing.name}` : 'Add a catalogue entry'}</h3>
      <div class="row">
        <label>
          Name (what clients put in model)
          <input {...text('name')} required disabled={!!props.editing} placeholder="org/model:tag" />
        </label>
        <label class="wide">
          Model path
          <input {...text('modelPath')} required placeholder="Qwen/Qwen2.5-7B-Instruct or /models/llama" />
        </label>
      </div>
      <div class="row">
        <label>
          Tensor parallel
          <input {...text('tp')} type="number" min={1} placeholder="GPUs given, else 1" />
        </label>
        <label>
          GPUs
          <input {...text('gpuIds')} placeholder="any (e.g. 0, 1)" />
        </label>
        <label>
          Context length
          <input {...text('maxTokens')} type="number" min={1} placeholder="model's maximum" />
        </label>
        <label>
          GPU memory share
          <input
            {...text('utilization')}
            type="number"
            min={0.05}
            max={1}
            step={0.01}
            placeholder="default"
          />
        </label>
      </div>
      <label>
        Extra engine arguments
        <input {...text('extraArgs')} placeholder="--dtype bfloat16 --enforce-eager" />
      </label>
      <div class="actions">
        <label class="inline">
          <input {...check('sleep')} name="enable_sleep_mode" /> sleep mode
        </label>
        <label class="inline">
          <input {...check('pin')} name="pin" /> pin (never evicted)
        </label>
        <label class="inline">
          <input {...check('preload')} name="preload" /> preload (loaded at start)
        </label>
      </div>
      <div class="actions">
        <button type="submit" class="primary" disabled={busy || !f.name.trim() || !f.modelPath.trim()}>
          {busy ? 'Saving…' : 'Save entry'}
        </button>
        {props.editing && (
          <button type="button" onClick={props.onCancel}>
            Cancel
          </button>
        )}
        {saved && (
          <span class="muted" role="status">
            {saved.text}
          </span>
        )}
      </div>
      {saved?.warning && <p class="note warn">{saved.warning}</p>}
      <ErrorNote error={error} />
    </form>
  )
}
