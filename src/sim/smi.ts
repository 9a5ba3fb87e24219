import type { SimGpu } from './gpus.ts'
import {
  type AppView,
  DRIVER_VERSION,
  type FieldDef,
  type GpuView,
  SMI_APP_FIELDS,
  SMI_GPU_FIELDS,
} from './smi-fields.ts'
import { appsOnGpu, type EngineRecord, readLiveEngines, usedMibOnGpu } from './state.ts'

/**
 * runSmi answers nvidia-smi queries (`--query-gpu=`, `--query-compute-apps=`, `-L`, the bare table)
 * from the simulated state directory, with nvidia-smi's CSV formats, errors and exit codes.
 */
export interface SmiResult {
  code: number
  stdout: string
}

interface SmiOptions {
  queryGpu?: string
  queryApps?: string
  format?: string
  ids?: string
  list: boolean
}

const INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"

function parseSmiArgs(argv: string[]): SmiOptions | undefined {
  const opts: SmiOptions = { list: false }
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? ''
    const eq = arg.indexOf('=')
    const name = eq >= 0 ? arg.slice(0, eq) : arg
    const value = (): string => (eq >= 0 ? arg.slice(eq + 1) : (argv[++i] ?? ''))
    if (name === '--query-gpu') opts.queryGpu = value()
    else if (name === '--query-compute-apps') opts.queryApps = value()
    else if (name === '--format') opts.format = value()
    else if (name === '-i' || name === '--id') opts.ids = value()
    else if (name === '-L' || name === '--list-gpus') opts.list = true
    else return undefined
  }
  return opts
}

export function runSmi(argv: string[], env: NodeJS.ProcessEnv, simDir: string, gpus: SimGpu[]): SmiResult {
  if (env['MODELGATE_SIM_SMI_FAIL']) {
    return {
      code: 9,
      stdout:
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n\n",
    }
  }
  const opts = parseSmiArgs(argv)
  if (!opts || (opts.queryGpu !== undefined && opts.queryApps !== undefined))
    return { code: 2, stdout: INVALID_ARGS }
  const format = parseFormat(opts.format ?? 'csv')
  if (!format) return { code: 2, stdout: INVALID_ARGS }
  const selected = selectGpus(gpus, opts.ids)
  if (!selected) return { code: 6, stdout: 'No devices were found\n' }
  const records = readLiveEngines(simDir)
  const na = new Set(
    (env['MODELGATE_SIM_SMI_NA'] ?? '')
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean),
  )

  if (opts.queryGpu !== undefined) {
    const views = selected.map((gpu) => gpuView(gpu, gpus.length, records))
    return renderQuery(opts.queryGpu, SMI_GPU_FIELDS, views, format, na)
  }
  if (opts.queryApps !== undefined) {
    const views: AppView[] = []
    for (const gpu of selected) {
      for (const record of records)
        for (const app of appsOnGpu(record, gpu.index)) views.push({ record, app, gpu })
    }
    return renderQuery(opts.queryApps, SMI_APP_FIELDS, views, format, na)
  }
  if (opts.list) {
    return { code: 0, stdout: selected.map((g) => `GPU ${g.index}: ${g.name} (UUID: ${g.uuid})\n`).join('') }
  }
  return {
    code: 0,
    stdout: renderTable(
      selected.map((gpu) => gpuView(gpu, gpus.length, records)),
      records,
    ),
  }
}

interface Format {
  header: boolean
  units: boolean
}

function parseFormat(spec: string): Format | undefined {
  const parts = spec.split(',').map((s) => s.trim())
  if (parts[0] !== 'csv' || parts.slice(1).some((p) => p !== 'noheader' && p !== 'nounits')) return undefined
  return { header: !parts.includes('noheader'), units: !parts.includes('nounits') }
}

function selectGpus(gpus: SimGpu[], ids: string | undefined): SimGpu[] | undefined {
  if (ids === undefined) return gpus
  const out: SimGpu[] = []
  for (const id of ids.split(',').map((s) => s.trim())) {
    const gpu = gpus.find((g) => String(g.index) === id || g.uuid === id || g.busId === id)
    if (!gpu) return undefined
    out.push(gpu)
  }
  return out
}

export function gpuView(gpu: SimGpu, count: number, records: EngineRecord[]): GpuView {
  let running = 0
  for (const r of records)
    if (appsOnGpu(r, gpu.index).length > 0 && !r.sleeping) running += r.running ?? (r.busy ? 1 : 0)
  const utilization = running > 0 ? Math.min(95, 30 + 3 * running) : 0
  return {
    gpu,
    count,
    usedMib: Math.min(gpu.totalMib, usedMibOnGpu(records, gpu.index)),
    utilization,
    temperature: 30 + gpu.index + Math.round(utilization * 0.4),
  }
}

function renderQuery<T>(
  query: string,
  table: Map<string, FieldDef<T>>,
  views: T[],
  format: Format,
  na: Set<string>,
): SmiResult {
  const names = query.split(',').map((s) => s.trim())
  const defs: [string, FieldDef<T>][] = []
  for (const name of names) {
    const def = table.get(name)
    if (!def) return { code: 2, stdout: `Field "${name}" is not a valid field to query.\n\n` }
    defs.push([name, def])
  }
  let out = ''
  if (format.header) {
    out += `${defs.map(([, d]) => (d.unit && format.units ? `${d.header} [${d.unit}]` : d.header)).join(', ')}\n`
  }
  for (const view of views) {
    const cells = defs.map(([name, def]) => {
      if (na.has(name) || na.has(def.header)) return '[N/A]'
      const value = String(def.value(view))
      return def.unit && format.units ? `${value} ${def.unit}` : value
    })
    out += `${cells.join(', ')}\n`
  }
  return { code: 0, stdout: out }
}

function renderTable(views: GpuView[], records: EngineRecord[]): string {
  const line = '+-----------------------------------------------------------------------------------------+'
  const rows = [
    new Date().toString().slice(0, 24),
    line,
    `| NVIDIA-SMI ${DRIVER_VERSION}              Driver Version: ${DRIVER_VERSION}      CUDA Version: 12.4     |`,
    line,
  ]
  for (const v of views) {
    const mem = `${v.usedMib}MiB / ${v.gpu.totalMib}MiB`
    rows.push(
      `| ${String(v.gpu.index).padEnd(3)} ${v.gpu.name.padEnd(30)} | ${v.gpu.busId} | ${mem.padStart(22)} | ${String(v.utilization).padStart(3)}% |`,
    )
  }
  rows.push(
    line,
    '| Processes:                                                                              |',
  )
  const apps = records.flatMap((r) => r.gpus.flatMap((g) => appsOnGpu(r, g).map((a) => ({ r, g, a }))))
  if (apps.length === 0)
    rows.push('|  No running processes found                                                             |')
  for (const { r, g, a } of apps)
    rows.push(
      `|  ${String(g).padEnd(4)} ${String(a.pid).padStart(8)}  C  ${a.process_name.padEnd(40)} ${String(r.used_mib_per_gpu).padStart(8)}MiB |`,
    )
  rows.push(line)
  return `${rows.join('\n')}\n`
}
