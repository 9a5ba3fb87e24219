import { resolve } from 'node:path'

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
