import { ENGINE_DRIVERS, type EngineKind } from '../../../src/engine/kinds.ts'
import type { GpuSnapshot } from '../../../src/gpu/smi.ts'
import type { ProcInfo } from './proc.ts'

/**
 * What makes a process look like an inference engine to the orphans listing (its name, its command
 * line, the GPU memory nvidia-smi shows it holding), and how its command line is shown. What each
 * engine looks like is its driver's to say (EngineDriver.looksLike).
 */
export type OrphanReason = 'gpu_memory' | `${EngineKind}_command` | 'engine_process_name' | 'simulator'

/** ORPHAN_REASONS: every reason, for the API's schema. */
export const ORPHAN_REASONS: readonly OrphanReason[] = [
  'gpu_memory',
  ...(Object.keys(ENGINE_DRIVERS) as EngineKind[]).map((k) => `${k}_command` as const),
  'engine_process_name',
  'simulator',
]

const MAX_COMMAND_CHARS = 2000
const SECRET_FLAG = /key|token|secret|passw/i

/** engineReasons: what in a process's name or command line says it is an inference engine. */
export function engineReasons(info: Pick<ProcInfo, 'comm' | 'argv'>): OrphanReason[] {
  const out: OrphanReason[] = []
  for (const [kind, driver] of Object.entries(ENGINE_DRIVERS) as [
    EngineKind,
    (typeof ENGINE_DRIVERS)[EngineKind],
  ][])
    for (const r of driver.looksLike(info)) {
      const reason: OrphanReason = r === 'command' ? `${kind}_command` : 'engine_process_name'
      if (!out.includes(reason)) out.push(reason)
    }
  // modelgate's simulators: `modelgate sim engine|sglang …`, `bun src/main.ts sim engine …`.
  const argv = info.argv
  for (let i = 0; i <= 2 && i < argv.length; i++)
    if (argv[i] === 'sim' && (argv[i + 1] === 'engine' || argv[i + 1] === 'sglang')) {
      out.push('simulator')
      break
    }
  return out
}

/** shownCommand: the command line with the values of key/token/secret/password flags hidden. */
export function shownCommand(info: Pick<ProcInfo, 'comm' | 'argv'>): string {
  if (info.argv.length === 0) return `[${info.comm}]`
  const out: string[] = []
  for (let i = 0; i < info.argv.length; i++) {
    const a = info.argv[i] ?? ''
    if (a.startsWith('-') && SECRET_FLAG.test(a)) {
      const eq = a.indexOf('=')
      if (eq > 0) out.push(`${a.slice(0, eq)}=***`)
      else {
        out.push(a)
        if (i + 1 < info.argv.length && !(info.argv[i + 1] ?? '').startsWith('-')) {
          out.push('***')
          i++
        }
      }
    } else out.push(/\s/.test(a) || a === '' ? JSON.stringify(a) : a)
  }
  const s = out.join(' ')
  return s.length > MAX_COMMAND_CHARS ? `${s.slice(0, MAX_COMMAND_CHARS)}…` : s
}

/** gpuMemoryByPid: MiB per GPU index per pid, from nvidia-smi's compute apps. */
export function gpuMemoryByPid(snapshot: GpuSnapshot): Map<number, Map<number, number>> {
  const out = new Map<number, Map<number, number>>()
  if (!snapshot.available) return out
  const indexOf = new Map(snapshot.gpus.map((g) => [g.uuid, g.index]))
  for (const app of snapshot.apps) {
    if (app.pid === null) continue
    const idx = indexOf.get(app.gpuUuid)
    if (idx === undefined) continue
    const m = out.get(app.pid) ?? new Map<number, number>()
    m.set(idx, (m.get(idx) ?? 0) + (app.usedMemoryMib ?? 0))
    out.set(app.pid, m)
  }
  return out
}
