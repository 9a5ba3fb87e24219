import { ApiError, call, get, id, post } from '../../../../src/dashboard/client/api.ts'
import type {
  CatalogEntry,
  CatalogEntryFields,
  CatalogSaved,
  CheckRequest,
  CheckResult,
  GpuAvailable,
  LoadRequest,
  LoadResponse,
  MemoryProfile,
  MoveRecord,
  MultiGpu,
  PresetDetail,
  PresetSummary,
  Residency,
  SleepLevel,
  SleepResult,
  WakeResult,
} from './types.ts'

/** The host's client, which the gateway's pages use too (its errors, the inference key). */
export { ApiError, api as host, errorFrom } from '../../../../src/dashboard/client/api.ts'

/** api: the gateway's routes, as its pages call them (through the host's one client, `call`). */
export const api = {
  load: (body: LoadRequest) => post<LoadResponse>('/api/v1/models/load', body),
  unload: (i: string) => post<unknown>(`/api/v1/models/${id(i)}/unload`),
  sleep: (i: string, level: SleepLevel) =>
    post<SleepResult>(`/api/models/instances/${id(i)}/sleep?level=${level}`),
  wake: (i: string) => post<WakeResult>(`/api/models/instances/${id(i)}/wake`),
  move: (i: string, target_gpu_ids: number[], drain_timeout_ms?: number) =>
    post<MoveRecord>(`/api/models/instances/${id(i)}/move`, {
      target_gpu_ids,
      ...(drain_timeout_ms === undefined ? {} : { drain_timeout_ms }),
    }),
  cancelMove: (moveId: string, force: boolean) =>
    call<void>('DELETE', `/api/models/moves/${id(moveId)}?force=${force}`),

  gpus: () => get<GpuAvailable>('/api/gpu/available'),
  memory: () => get<MultiGpu>('/api/memory/usage/multi-gpu'),
  check: (body: CheckRequest) => post<CheckResult>('/api/memory/profiles/check', body),

  presets: () => get<{ configurations: PresetSummary[]; total: number }>('/api/configurations'),
  preset: (i: string) => get<{ configuration: PresetDetail }>(`/api/configurations/${id(i)}`),
  savePreset: (name: string, description?: string) =>
    post<{ configuration: PresetSummary }>('/api/configurations', {
      name,
      ...(description ? { description } : {}),
    }),
  loadPreset: (i: string) => post<{ status: string; configId: string }>(`/api/configurations/${id(i)}/load`),
  deletePreset: (i: string) => call<unknown>('DELETE', `/api/configurations/${id(i)}`),
  profiles: () => get<{ profiles: MemoryProfile[]; total: number }>('/api/memory/profiles'),

  catalog: () => get<{ entries: CatalogEntry[]; total: number }>('/api/catalog'),
  saveCatalogEntry: (name: string, body: CatalogEntryFields) =>
    call<CatalogSaved>('PUT', `/api/catalog/${id(name)}`, body),
  deleteCatalogEntry: (name: string) => call<unknown>('DELETE', `/api/catalog/${id(name)}`),
  /** residency: the residency manager's view, or null where this gateway has none (404). */
  residency: async (): Promise<Residency | null> => {
    try {
      return await get<Residency>('/api/residency')
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) return null
      throw err
    }
  },
  deleteProfile: (i: string) => call<unknown>('DELETE', `/api/memory/profiles/${id(i)}`),
}
