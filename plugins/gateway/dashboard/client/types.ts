import type { Static } from 'elysia'
import type { AuthService, LoginResult, Principal } from '../../../../src/http/auth.ts'
import type { ControllerErrorBody, ProxyErrorBody } from '../../../../src/http/errors.ts'
import type { ResidencySchema } from '../../residency/routes.ts'
import type { GpuAvailableSchema, MultiGpuSchema } from '../../schemas.ts'
import type { Features as FeaturesSchema, InferenceKey } from '../routes.ts'

export type {
  BenchmarkRun,
  CreateRun,
  RunSummary,
  Scenario,
  ScenarioMetrics,
} from '../../../benchmarks/schemas.ts'
export type { ClusterStatus, Pod, RoutingTable } from '../../../cluster/schemas.ts'

import type { RouterOverviewSchema } from '../../../router/dashboard.ts'
import type { ActionResultSchema } from '../../../router/schemas.ts'
export type RouterOverview = Static<typeof RouterOverviewSchema>
export type RouterAction = Static<typeof ActionResultSchema>
export type { KeyInput, KeyView } from '../../../../src/http/keys/service.ts'
export type { UsageRow } from '../../../../src/http/keys/usage-book.ts'
/**
 * The records the dashboard reads and sends, derived from the declarations the routes validate
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
export type { LoginResult }

import type { KeyView as KeyViewRecord } from '../../../../src/http/keys/service.ts'
/** KeyCreated: POST /api/keys: the key, and its secret (this once). */
export type KeyCreated = KeyViewRecord & { key: string }

export type GpuAvailable = Static<typeof GpuAvailableSchema>
export type MultiGpu = Static<typeof MultiGpuSchema>
export type GpuRow = MultiGpu['gpus'][number]
export type ModelMemory = GpuRow['models'][number]
export type KvCache = MultiGpu['kvcache']
export type InferenceKeyAnswer = Static<typeof InferenceKey>
export type Features = Static<typeof FeaturesSchema>
/** Residency: GET /api/residency, the residency manager's view (404 where it does not run). */
export type Residency = Static<typeof ResidencySchema>
export type ResidencyModel = Residency['models'][number]
export type ResidencyDecision = Residency['decisions'][number]

/** AuthInfo: GET /api/auth/info. */
export type AuthInfo = ReturnType<AuthService['info']>
/** Me: GET /api/auth/me (the principal the guard found). */
export type Me = Principal

/** ErrorBody: either of the two error shapes (admin API, inference). */
export type ErrorBody = ControllerErrorBody | ProxyErrorBody
