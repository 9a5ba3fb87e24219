import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { isAlive } from '../engine/process.ts'

/**
 * EngineRecord is the footprint a running simulated engine leaves in `DIR/engines/<pid>.json`. It is the
 * only channel between the engine simulator and the smi simulator, like GPU memory is on a real host.
 */
export interface EngineRecord {
  /** The `vllm serve` (API server) process; the record lives as long as it does. */
  pid: number
  /** Physical GPU indices (from CUDA_VISIBLE_DEVICES). */
  gpus: number[]
  used_mib_per_gpu: number
  process_name: string
  /**
   * apps are the processes that hold the GPU memory, as nvidia-smi lists them: the engine core
   * (`VLLM::EngineCore`) or, with tensor parallelism, one worker per GPU (`VLLM::Worker_TPn`). Without
   * them the memory is shown under `pid` (older records, or no helper processes could be started).
   */
  apps?: EngineApp[]
  model: string
  started_at: string
  /** Requests currently generating; drives utilization.gpu. */
  running?: number
  busy?: boolean
  sleeping?: boolean
  port?: number
}

export interface EngineApp {
  pid: number
  /** Physical GPU index. */
  gpu: number
  process_name: string
}

/** Base memory an idle device reports as used, like an idle H100. */
export const IDLE_USED_MIB = 4

export function resolveSimDir(flag: string | undefined, env: NodeJS.ProcessEnv): string {
  return flag ?? env['MODELGATE_SIM_DIR'] ?? join(tmpdir(), 'modelgate-sim')
}

function enginesDir(simDir: string): string {
  return join(simDir, 'engines')
}

/** writeEngineRecord replaces the record atomically (write a temp file, then rename). */
export function writeEngineRecord(simDir: string, record: EngineRecord): void {
  const dir = enginesDir(simDir)
  mkdirSync(dir, { recursive: true })
  const tmp = join(dir, `.${record.pid}.json.tmp`)
  writeFileSync(tmp, JSON.stringify(record))
  renameSync(tmp, join(dir, `${record.pid}.json`))
}

export function removeEngineRecord(simDir: string, pid: number): void {
  rmSync(join(enginesDir(simDir), `${pid}.json`), { force: true })
}

/** readLiveEngines lists the records of live engines and deletes those whose process is gone. */
export function readLiveEngines(simDir: string): EngineRecord[] {
  const dir = enginesDir(simDir)
  let names: string[]
  try {
    names = readdirSync(dir)
  } catch {
    return []
  }
  const records: EngineRecord[] = []
  for (const name of names) {
    if (name.startsWith('.') || !name.endsWith('.json')) continue
    const path = join(dir, name)
    let record: EngineRecord
    try {
      record = JSON.parse(readFileSync(path, 'utf8')) as EngineRecord
    } catch {
      continue
    }
    if (typeof record.pid !== 'number' || !Array.isArray(record.gpus)) continue
    if (!isAlive(record.pid)) {
      rmSync(path, { force: true })
      continue
    }
    records.push(record)
  }
  return records.sort((a, b) => a.pid - b.pid)
}

/**
 * appsOnGpu lists the processes of one record holding memory on a GPU, as nvidia-smi shows them: the
 * record's live apps on that GPU (a dead process's memory is freed by the driver), else the record's
 * own pid.
 */
export function appsOnGpu(record: EngineRecord, gpu: number): { pid: number; process_name: string }[] {
  if (!record.gpus.includes(gpu)) return []
  if (!record.apps) return [{ pid: record.pid, process_name: record.process_name }]
  return record.apps.filter((a) => a.gpu === gpu && isAlive(a.pid))
}

/** usedMibOnGpu sums the footprints on one physical GPU, optionally leaving out one pid (ourselves). */
export function usedMibOnGpu(records: EngineRecord[], gpu: number, exceptPid?: number): number {
  let used = IDLE_USED_MIB
  for (const r of records) {
    if (r.pid === exceptPid) continue
    used += appsOnGpu(r, gpu).length > 0 ? r.used_mib_per_gpu : 0
  }
  return used
}
