import type { SimGpu } from './gpus.ts'
import type { EngineRecord } from './state.ts'

/**
 * SMI_GPU_FIELDS and SMI_APP_FIELDS are the `--query-gpu=` / `--query-compute-apps=` fields the smi
 * simulator knows, with nvidia-smi's header names and units, so any subset in any order can be answered.
 */
export type Unit = 'MiB' | '%' | 'W' | 'MHz'

export interface GpuView {
  gpu: SimGpu
  count: number
  usedMib: number
  utilization: number
  temperature: number
}

export interface AppView {
  record: EngineRecord
  /** The process holding the memory (an engine's child, see EngineRecord.apps). */
  app: { pid: number; process_name: string }
  gpu: SimGpu
}

export interface FieldDef<T> {
  header: string
  unit?: Unit
  value: (view: T) => string | number
}

export const DRIVER_VERSION = '550.54.15'

const gpuFields: [string[], FieldDef<GpuView>][] = [
  [['index'], { header: 'index', value: (v) => v.gpu.index }],
  [['uuid', 'gpu_uuid'], { header: 'uuid', value: (v) => v.gpu.uuid }],
  [['name', 'gpu_name'], { header: 'name', value: (v) => v.gpu.name }],
  [['pci.bus_id', 'gpu_bus_id'], { header: 'pci.bus_id', value: (v) => v.gpu.busId }],
  [['driver_version'], { header: 'driver_version', value: () => DRIVER_VERSION }],
  [['count'], { header: 'count', value: (v) => v.count }],
  [['serial', 'gpu_serial'], { header: 'serial', value: (v) => String(1650923000000 + v.gpu.index) }],
  [['memory.total'], { header: 'memory.total', unit: 'MiB', value: (v) => v.gpu.totalMib }],
  [['memory.used'], { header: 'memory.used', unit: 'MiB', value: (v) => v.usedMib }],
  [
    ['memory.free'],
    { header: 'memory.free', unit: 'MiB', value: (v) => Math.max(0, v.gpu.totalMib - v.usedMib) },
  ],
  [['memory.reserved'], { header: 'memory.reserved', unit: 'MiB', value: () => 0 }],
  [['utilization.gpu'], { header: 'utilization.gpu', unit: '%', value: (v) => v.utilization }],
  [
    ['utilization.memory'],
    { header: 'utilization.memory', unit: '%', value: (v) => Math.round(v.utilization * 0.6) },
  ],
  [['temperature.gpu'], { header: 'temperature.gpu', value: (v) => v.temperature }],
  [
    ['power.draw'],
    { header: 'power.draw', unit: 'W', value: (v) => (70 + (v.utilization / 100) * 550).toFixed(2) },
  ],
  [['power.limit'], { header: 'power.limit', unit: 'W', value: () => '700.00' }],
  [['clocks.sm', 'clocks.current.sm'], { header: 'clocks.current.sm', unit: 'MHz', value: () => 1980 }],
  [['pstate'], { header: 'pstate', value: () => 'P0' }],
  [['compute_mode'], { header: 'compute_mode', value: () => 'Default' }],
  [['persistence_mode'], { header: 'persistence_mode', value: () => 'Enabled' }],
  [['timestamp'], { header: 'timestamp', value: () => smiTimestamp() }],
]

const appFields: [string[], FieldDef<AppView>][] = [
  [['pid'], { header: 'pid', value: (v) => v.app.pid }],
  [['process_name', 'name'], { header: 'process_name', value: (v) => v.app.process_name }],
  [
    ['used_memory', 'used_gpu_memory'],
    { header: 'used_gpu_memory', unit: 'MiB', value: (v) => v.record.used_mib_per_gpu },
  ],
  [['gpu_uuid'], { header: 'gpu_uuid', value: (v) => v.gpu.uuid }],
  [['gpu_bus_id'], { header: 'gpu_bus_id', value: (v) => v.gpu.busId }],
  [['gpu_name'], { header: 'gpu_name', value: (v) => v.gpu.name }],
  [['gpu_serial'], { header: 'gpu_serial', value: (v) => String(1650923000000 + v.gpu.index) }],
  [['timestamp'], { header: 'timestamp', value: () => smiTimestamp() }],
]

function table<T>(entries: [string[], FieldDef<T>][]): Map<string, FieldDef<T>> {
  const map = new Map<string, FieldDef<T>>()
  for (const [names, def] of entries) for (const n of names) map.set(n, def)
  return map
}

export const SMI_GPU_FIELDS = table(gpuFields)
export const SMI_APP_FIELDS = table(appFields)

export function smiTimestamp(date = new Date()): string {
  const p = (n: number, w = 2) => String(n).padStart(w, '0')
  return (
    `${date.getFullYear()}/${p(date.getMonth() + 1)}/${p(date.getDate())} ` +
    `${p(date.getHours())}:${p(date.getMinutes())}:${p(date.getSeconds())}.${p(date.getMilliseconds(), 3)}`
  )
}
