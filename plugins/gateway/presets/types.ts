import type { EngineKind } from '../../../src/engine/kinds.ts'
import type { PresetSourceType } from '../db/presets.ts'

/** The preset records (a leaf module, so GatewayPodApi can name them without an import cycle). */
export interface PresetEntry {
  id: string
  modelPath: string
  servedModelName: string
  maxTokens: number | null
  sourceType: PresetSourceType
  gpuIds: number[]
  tensorParallelSize: number
  extraArgs: string[]
  loadOrder: number
  enableSleepMode: boolean
  gpuMemoryUtilization: number | null
  /**
   * engineKind: the engine the model ran when it was saved, which its load runs again; null: not
   * known (saved before presets kept it, or sent by a leader that does not), the gateway's engine.kind.
   */
  engineKind: EngineKind | null
}

export interface PresetSummary {
  id: string
  name: string
  description: string | null
  modelCount: number
  createdAt: string
  updatedAt: string
}

export interface PresetDetail extends PresetSummary {
  entries: PresetEntry[]
}

/** PresetSyncResult: what a pod did with the presets a leader sent (POST /internal/presets/sync). */
export interface PresetSyncResult {
  created: number
  updated: number
  unchanged: number
  /** left out: their name belongs to another preset on this pod */
  conflicts: { id: string; name: string; reason: string }[]
}
