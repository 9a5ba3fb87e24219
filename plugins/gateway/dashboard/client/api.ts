import type {
  AuthInfo,
  BenchmarkRun,
  CatalogEntry,
  CatalogEntryFields,
  CatalogSaved,
  CheckRequest,
  CheckResult,
  ClusterStatus,
  CreateRun,
  ErrorBody,
  Features,
  GpuAvailable,
  InferenceKeyAnswer,
  InstanceRecord,
  KeyCreated,
  KeyInput,
  KeyView,
  LoadRequest,
  LoadResponse,
  LoginResult,
  Me,
  MemoryProfile,
  MoveRecord,
  MultiGpu,
  Pod,
  PresetDetail,
  PresetSummary,
  Residency,
  RouterAction,
  RouterOverview,
  RoutingTable,
  RunSummary,
  SleepLevel,
  SleepResult,
  UsageRow,
  WakeResult,
} from './types.ts'

/**
 * The dashboard's one client for the gateway's API: every call goes to this origin with the JWT
 * (when logged in), and every failure becomes an ApiError whose message is the server's own
 * (either error shape), ready to be shown next to the control that caused it.
 */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message)
    this.name = 'ApiError'
  }
}

/** auth: where the API client reads the token, and whom it tells when the server stops accepting it. */
export const auth = {
  token: null as string | null,
  onUnauthorized: (_message: string) => {},
}

/** errorFrom reads either error shape (controller `{error: {code, message}}`, proxy `{error: {message, code}}`). */
export async function errorFrom(res: Response): Promise<ApiError> {
  const text = await res.text().catch(() => '')
  try {
    const body = JSON.parse(text) as ErrorBody | { status?: string; message?: string }
    if ('error' in body && body.error?.message)
      return new ApiError(res.status, body.error.code ?? '', body.error.message)
    // The router's action result: {status: 'error', model, message}.
    if ('status' in body && body.status === 'error' && typeof body.message === 'string')
      return new ApiError(res.status, 'ACTION_REFUSED', body.message)
  } catch {
    // not JSON: fall through
  }
  return new ApiError(res.status, `HTTP_${res.status}`, `${res.status} ${res.statusText || 'error'}`.trim())
}

/** headers: the JWT (when there is one) plus `extra`. */
export function authHeaders(extra: Record<string, string> = {}): Record<string, string> {
  return auth.token ? { ...extra, authorization: `Bearer ${auth.token}` } : extra
}

/** call: one request; JSON in and out; a 401 on an authenticated call ends the session. */
export async function call<T>(
  method: string,
  path: string,
  body?: unknown,
  signal?: AbortSignal,
): Promise<T> {
  let res: Response
  try {
    res = await fetch(path, {
      method,
      headers: authHeaders(body === undefined ? {} : { 'content-type': 'application/json' }),
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      ...(signal ? { signal } : {}),
    })
  } catch (err) {
    if (signal?.aborted) throw err
    throw new ApiError(0, 'NETWORK_ERROR', 'The gateway cannot be reached')
  }
  if (!res.ok) {
    const err = await errorFrom(res)
    if (res.status === 401 && auth.token && !path.startsWith('/api/auth/login'))
      auth.onUnauthorized(err.message)
    throw err
  }
  if (res.status === 204) return undefined as T
  return (await res.json()) as T
}

const get = <T>(path: string, signal?: AbortSignal) => call<T>('GET', path, undefined, signal)
const post = <T>(path: string, body?: unknown) => call<T>('POST', path, body ?? {})
const id = encodeURIComponent

export const api = {
  authInfo: () => get<AuthInfo>('/api/auth/info'),
  login: (username: string, password: string) => post<LoginResult>('/api/auth/login', { username, password }),
  me: () => get<Me>('/api/auth/me'),
  logout: () => post<{ success: boolean; message: string }>('/api/auth/logout'),
  inferenceKey: () => get<InferenceKeyAnswer>('/api/dashboard/inference-key'),
  features: () => get<Features>('/api/dashboard/features'),

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

  benchmarks: () => get<{ benchmarks: RunSummary[]; total: number }>('/api/benchmarks?limit=100'),
  benchmark: (i: string) => get<{ benchmark: BenchmarkRun }>(`/api/benchmarks/${id(i)}`),
  createBenchmark: (body: CreateRun) => post<{ benchmark: BenchmarkRun }>('/api/benchmarks', body),
  deleteBenchmark: (i: string) => call<unknown>('DELETE', `/api/benchmarks/${id(i)}`),

  router: () => get<RouterOverview>('/api/dashboard/router'),
  routerSleep: (name: string) => post<RouterAction>(`/api/dashboard/router/models/${id(name)}/sleep`),
  routerWake: (name: string) => post<RouterAction>(`/api/dashboard/router/models/${id(name)}/wake`),

  keys: () => get<{ keys: KeyView[]; total: number }>('/api/keys'),
  createKey: (body: KeyInput) => post<KeyCreated>('/api/keys', body),
  updateKey: (i: string, body: Partial<KeyInput>) => call<KeyView>('PATCH', `/api/keys/${id(i)}`, body),
  revokeKey: (i: string) => call<{ id: string; revoked: true }>('DELETE', `/api/keys/${id(i)}`),
  keyUsage: (i: string) =>
    get<{ from: string; to: string; rows: UsageRow[] }>(`/api/keys/${id(i)}/usage?granularity=hour`),

  cluster: () => get<ClusterStatus>('/api/cluster'),
  clusterPods: () => get<{ pods: Pod[] }>('/api/cluster/pods'),
  routingTable: () => get<RoutingTable>('/api/cluster/routing-table'),
  podMemory: (podId: string) => get<MultiGpu & { podId: string }>(`/api/cluster/pods/${id(podId)}/memory`),
  podModels: (podId: string) =>
    get<{ models: InstanceRecord[]; podId: string }>(`/api/cluster/pods/${id(podId)}/models/full`),
}
