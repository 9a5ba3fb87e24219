import type { Static } from 'elysia'
import type { AuthService, LoginResult, Principal } from '../../http/auth.ts'
import type { ControllerErrorBody, ProxyErrorBody } from '../../http/errors.ts'
import type { KeyView as KeyViewRecord } from '../../http/keys/service.ts'
import type { DashboardPagesSchema, InferenceKey } from '../schemas.ts'

/**
 * The records the shell and the host's own pages read and send, derived from the declarations the
 * routes validate with: a field renamed on the server fails `tsc` here. Every import is type-only,
 * so no server code reaches the bundle. A plugin's pages take their records from that plugin's
 * own declarations (its `api.ts` for another plugin's), never from here.
 */
export type { KeyInput, KeyView } from '../../http/keys/service.ts'
export type { UsageRow } from '../../http/keys/usage-book.ts'
export type { LoginResult }

/** KeyCreated: POST /api/keys: the key, and its secret (this once). */
export type KeyCreated = KeyViewRecord & { key: string }

export type InferenceKeyAnswer = Static<typeof InferenceKey>
/** DashboardPages: GET /api/dashboard/pages, the pages of the plugins that are on. */
export type DashboardPages = Static<typeof DashboardPagesSchema>
export type PageEntry = DashboardPages['pages'][number]

/** AuthInfo: GET /api/auth/info. */
export type AuthInfo = ReturnType<AuthService['info']>
/** Me: GET /api/auth/me (the principal the guard found). */
export type Me = Principal

/** ErrorBody: either of the two error shapes (admin API, inference). */
export type ErrorBody = ControllerErrorBody | ProxyErrorBody

/**
 * TimeSeries: series sampled at one interval, oldest first, as the time charts draw them (the
 * gateway's last hour, a key's usage by hour). Structural: any plugin's series of this shape fits.
 */
export interface TimeSeries {
  interval_ms: number
  t: number[]
  series: Record<string, (number | null)[]>
}

/**
 * GpuRow and GpuHolder: what the GPU bar (components/gpu-bar.tsx) draws, one GPU of a memory view
 * and the records of what it holds. Structural, so every plugin that shows GPUs (the gateway's own,
 * a cluster's pods) draws them with the one bar; the callers' typed views are checked against it.
 */
export interface GpuRow {
  gpu_index: number
  name: string
  total_gb: number | null
  used_gb: number | null
  free_gb: number | null
  kvcache?: { total_gb: number; used_gb: number; prealloc_gb: number; free_gb: number } | null
  models: {
    instance_id: string
    display_name: string
    gpu_memory_gb: number
    weights_gb: number
    color: string
  }[]
}
export interface GpuHolder {
  status: string
  memory_baseline_by_gpu?: Record<string, number> | null
  sharedcache_enabled?: boolean
}
