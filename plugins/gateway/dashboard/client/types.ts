import type { Static } from 'elysia'
import type { ResidencySchema } from '../../residency/routes.ts'
import type { GpuAvailableSchema, MultiGpuSchema } from '../../schemas.ts'

/**
 * The records the gateway's pages read and send, derived from the declarations the routes validate
 * with (TypeBox schemas, or the interfaces a route's schema is checked against): a field renamed on
 * the server fails `tsc` here. Every import is type-only, so no server code reaches the bundle.
 */
export type {
  CatalogChange,
  CatalogEntry,
  CatalogEntryFields,
  CatalogSaved,
  InstanceRecord,
  InstanceStatus,
  LoadRequest,
  LoadResponse,
  MoveEvent,
  MovePhase,
  MoveRecord,
  SleepLevel,
  SleepResult,
  SleepStatus,
  WakeResult,
} from '../../api.ts'
export type { MemoryProfile } from '../../db/presets.ts'
export type { PresetProgressEvent } from '../../presets/service.ts'
export type { PresetDetail, PresetSummary } from '../../presets/types.ts'
export type { CheckRequest, CheckResult } from '../../profiles/check.ts'
export type { TimeSample, TimeSeries } from '../../timeseries/ring.ts'
export type { DashboardEventMap, DashboardEventName } from '../events.ts'

export type GpuAvailable = Static<typeof GpuAvailableSchema>
export type MultiGpu = Static<typeof MultiGpuSchema>
export type GpuRow = MultiGpu['gpus'][number]
export type ModelMemory = GpuRow['models'][number]
export type KvCache = MultiGpu['kvcache']
/** Residency: GET /api/residency, the residency manager's view (404 where it does not run). */
export type Residency = Static<typeof ResidencySchema>
export type ResidencyModel = Residency['models'][number]
export type ResidencyDecision = Residency['decisions'][number]
