import { resolve } from 'node:path'
import { listPids, type ProcInfo, readEnvVars, readProc } from './proc.ts'

/**
 * The marker every engine this gateway starts carries in its environment (inherited by its workers):
 * which modelgate install (its data dir) started it, and as which instance. It survives a restart of
 * modelgate, so an engine is recognised as ours, or as another install's, from the process alone.
 */
export const MARKER_INSTANCE_ID = 'MODELGATE_INSTANCE_ID'
export const MARKER_DATA_DIR = 'MODELGATE_DATA_DIR'
export const MARKER_VARS = [MARKER_INSTANCE_ID, MARKER_DATA_DIR] as const

/** engineMarker: the environment variables that mark an engine as started by the install at `dataDir`. */
export function engineMarker(instanceId: string, dataDir: string): Record<string, string> {
  return { [MARKER_INSTANCE_ID]: instanceId, [MARKER_DATA_DIR]: resolve(dataDir) }
}

/** EngineGroupRef: what an instance's row recorded of its engine. */
export interface EngineGroupRef {
  id: string
  pid: number | null
  pgid: number | null
  process_start_time: string | null
}

/**
 * instanceProcesses: the live processes provably left of an instance's engine once its leader is gone
 * (a `VLLM::EngineCore` or worker that outlived its API server, holding the GPU): in the recorded
 * process group, started no earlier than the engine, and carrying the instance's marker (its id and
 * this data dir). A process that merely reuses a recorded pid or group id has neither that start time
 * nor that marker, and is never among them.
 */
export function instanceProcesses(ref: EngineGroupRef, dataDir: string): ProcInfo[] {
  const pgid = ref.pgid ?? ref.pid
  const since = Number(ref.process_start_time)
  if (!pgid || ref.process_start_time === null || !Number.isFinite(since)) return []
  const want = engineMarker(ref.id, dataDir)
  const out: ProcInfo[] = []
  for (const pid of listPids()) {
    const info = readProc(pid)
    if (!info || info.pgid !== pgid || info.state === 'Z' || Number(info.startTime) < since) continue
    const vars = readEnvVars(pid, MARKER_VARS)
    if (
      vars?.[MARKER_INSTANCE_ID] === want[MARKER_INSTANCE_ID] &&
      vars?.[MARKER_DATA_DIR] === want[MARKER_DATA_DIR]
    )
      out.push(info)
  }
  return out
}
