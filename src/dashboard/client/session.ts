import { computed, signal } from '@preact/signals'
import { type ApiError, api, auth } from './api.ts'
import type { AuthInfo, Me } from './types.ts'

/**
 * The session: who is logged in, and how to log in. The JWT is kept in sessionStorage: it survives a
 * reload of the tab but not the tab itself, is not shared with other tabs or written to disk for
 * later like localStorage, and is never a cookie, so no other site can make the browser send it
 * (no CSRF: the API reads only the Authorization header). What a script on the page could read it
 * with is closed by the page's Content-Security-Policy (no inline or foreign script).
 *
 * OAuth mode: before leaving for `/api/auth/login`, the provider and `/api/auth/callback`, the tab
 * keeps a random login nonce in its sessionStorage and sends it along; the callback sends the
 * browser back here with `#token=<JWT>&token_type=Bearer&expires_in=<s>&nonce=<the same>`. The page
 * removes any token fragment from the address bar and history at once (history.replaceState), and
 * accepts the token only in OAuth mode and only when the nonce is the one this tab kept (then
 * forgets it): a link carrying someone else's token (`/#token=…`), opened in a new tab or this one,
 * signs nobody in. In simple mode the fragment's token is never used.
 */
export type SessionState =
  | { phase: 'loading' }
  | { phase: 'unreachable'; error: ApiError }
  | { phase: 'login'; info: AuthInfo; notice: string | null }
  | { phase: 'denied'; info: AuthInfo; user: Me }
  | { phase: 'ready'; info: AuthInfo; user: Me }

const KEY = 'modelgate.token'
/** NONCE_KEY: the login nonce of the OAuth login this tab began, until its callback comes back. */
const NONCE_KEY = 'modelgate.login-nonce'

export const session = signal<SessionState>({ phase: 'loading' })

/** user: the logged-in principal, or null. */
export const user = computed(() => (session.value.phase === 'ready' ? session.value.user : null))

/** canWrite: whether to show controls that change state (the `admin` role; admin-readonly only views). */
export const canWrite = computed(() => user.value?.roles.includes('admin') ?? false)

let expiry: ReturnType<typeof setTimeout> | undefined

function store(token: string | null): void {
  auth.token = token
  if (token) sessionStorage.setItem(KEY, token)
  else sessionStorage.removeItem(KEY)
}

/** takeFragment removes a token fragment (`#token=…`) from the address bar and history; its parameters. */
function takeFragment(): URLSearchParams | null {
  const hash = location.hash.slice(1)
  if (!hash || hash.startsWith('/')) return null
  const params = new URLSearchParams(hash)
  if (!params.has('token')) return null
  history.replaceState(null, '', `${location.pathname}${location.search}#/`)
  return params
}

/**
 * loginToken: the fragment's token when it ends the OAuth login this tab began (its nonce is the
 * one kept before leaving), else null. The kept nonce is used up either way.
 */
function loginToken(fragment: URLSearchParams, info: AuthInfo): string | null {
  if (info.mode !== 'oauth') return null
  const kept = sessionStorage.getItem(NONCE_KEY)
  sessionStorage.removeItem(NONCE_KEY)
  return kept && fragment.get('nonce') === kept ? fragment.get('token') || null : null
}

/** newNonce: 256 random bits, base64url (what /api/auth/login accepts as the login nonce). */
function newNonce(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32))
  return btoa(String.fromCharCode(...bytes))
    .replace(/\+/g, '-')
    .replace(/\//g, '_')
    .replace(/=+$/, '')
}

function hasRole(me: Me): boolean {
  return me.roles.includes('admin') || me.roles.includes('admin-readonly')
}

/** logoutAt ends the session when the token expires, so the page asks for a login instead of failing. */
function logoutAt(exp: number | undefined): void {
  clearTimeout(expiry)
  if (!exp) return
  const ms = exp * 1000 - Date.now()
  if (ms < 2 ** 31)
    expiry = setTimeout(() => expire('Your session has expired; log in again.'), Math.max(0, ms))
}

async function enter(info: AuthInfo): Promise<void> {
  const me = await api.me()
  if (!hasRole(me)) {
    session.value = { phase: 'denied', info, user: me }
    return
  }
  logoutAt(me.exp)
  session.value = { phase: 'ready', info, user: me }
}

/** start: find out how this gateway authenticates, and whether the stored token still holds. */
export async function startSession(): Promise<void> {
  const fragment = takeFragment()
  auth.token = sessionStorage.getItem(KEY)
  auth.onUnauthorized = (message) => expire(message)
  let info: AuthInfo
  try {
    info = await api.authInfo()
  } catch (err) {
    session.value = { phase: 'unreachable', error: err as ApiError }
    return
  }
  let notice: string | null = null
  if (fragment) {
    const token = loginToken(fragment, info)
    if (token) store(token)
    else notice = 'A sign-in link this tab did not ask for was ignored. Log in here.'
  }
  if (!info.auth_enabled || auth.token) {
    try {
      await enter(info)
      return
    } catch {
      store(null)
    }
  }
  session.value = { phase: 'login', info, notice }
}

/** login: simple mode's form. Throws the server's message (wrong password, too many attempts). */
export async function login(username: string, password: string): Promise<void> {
  const { info } = session.value as { info: AuthInfo }
  const result = await api.login(username, password)
  store(result.token)
  await enter(info)
}

/**
 * loginWithProvider: OAuth mode sends the browser to the provider (a navigation, not a request),
 * keeping a fresh login nonce for the token's return.
 */
export function loginWithProvider(): void {
  const { info } = session.value as { info: AuthInfo }
  const nonce = newNonce()
  sessionStorage.setItem(NONCE_KEY, nonce)
  const to = new URL(info.login_url ?? '/api/auth/login', location.href)
  to.searchParams.set('nonce', nonce)
  location.assign(to.href)
}

/** expire: the server no longer accepts the token (expired, revoked): back to the login. */
export function expire(notice: string): void {
  const current = session.value
  if (current.phase !== 'ready' && current.phase !== 'denied') return
  clearTimeout(expiry)
  store(null)
  session.value = { phase: 'login', info: current.info, notice }
}

/** logout revokes the token on the server (best effort) and forgets it here. */
export async function logout(): Promise<void> {
  const current = session.value
  if (current.phase !== 'ready' && current.phase !== 'denied') return
  await api.logout().catch(() => undefined)
  clearTimeout(expiry)
  store(null)
  session.value = { phase: 'login', info: current.info, notice: 'You are logged out.' }
}
