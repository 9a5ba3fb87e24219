import type {
  AuthInfo,
  DashboardPages,
  ErrorBody,
  InferenceKeyAnswer,
  KeyCreated,
  KeyInput,
  KeyView,
  LoginResult,
  Me,
  UsageRow,
} from './types.ts'

/**
 * The dashboard's one client for this host's API: every call goes to this origin with the JWT
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

/** get and post: the two calls most routes need (`call` for the rest); `id` encodes a path part. */
export const get = <T>(path: string, signal?: AbortSignal) => call<T>('GET', path, undefined, signal)
export const post = <T>(path: string, body?: unknown) => call<T>('POST', path, body ?? {})
export const id = encodeURIComponent

/** api: the host's own routes (login, the pages list, the inference key, keys); each plugin's pages call its own. */
export const api = {
  authInfo: () => get<AuthInfo>('/api/auth/info'),
  login: (username: string, password: string) => post<LoginResult>('/api/auth/login', { username, password }),
  me: () => get<Me>('/api/auth/me'),
  logout: () => post<{ success: boolean; message: string }>('/api/auth/logout'),
  inferenceKey: () => get<InferenceKeyAnswer>('/api/dashboard/inference-key'),
  pages: () => get<DashboardPages>('/api/dashboard/pages'),

  keys: () => get<{ keys: KeyView[]; total: number }>('/api/keys'),
  createKey: (body: KeyInput) => post<KeyCreated>('/api/keys', body),
  updateKey: (i: string, body: Partial<KeyInput>) => call<KeyView>('PATCH', `/api/keys/${id(i)}`, body),
  revokeKey: (i: string) => call<{ id: string; revoked: true }>('DELETE', `/api/keys/${id(i)}`),
  keyUsage: (i: string) =>
    get<{ from: string; to: string; rows: UsageRow[] }>(`/api/keys/${id(i)}/usage?granularity=hour`),
}
