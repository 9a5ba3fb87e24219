import { useState } from 'preact/hooks'
import type { ApiError } from '../api.ts'
import { login, loginWithProvider } from '../session.ts'
import type { AuthInfo } from '../types.ts'
import { ErrorNote } from './error-note.tsx'

/**
 * Login: simple mode's username and password form, or OAuth mode's button that sends the browser to
 * the identity provider (through `/api/auth/login`; it comes back with the token in the fragment).
 */
export function Login({ info, notice }: { info: AuthInfo; notice: string | null }) {
  const [username, setUsername] = useState('admin')
  const [password, setPassword] = useState('')
  const [error, setError] = useState<ApiError | null>(null)
  const [busy, setBusy] = useState(false)
  const submit = async (e: Event) => {
    e.preventDefault()
    setBusy(true)
    setError(null)
    try {
      await login(username, password)
    } catch (err) {
      setError(err as ApiError)
      setBusy(false)
    }
  }
  return (
    <main class="login card">
      <h1>modelgate</h1>
      {notice && <p class="note">{notice}</p>}
      {info.mode === 'oauth' ? (
        <>
          <p>
            Log in with your platform account{info.oauth ? ` (${new URL(info.oauth.issuer_url).host})` : ''}.
          </p>
          <button type="button" class="primary" onClick={loginWithProvider}>
            Log in
          </button>
        </>
      ) : (
        <form onSubmit={submit} aria-label="Log in">
          <label>
            Username
            <input
              name="username"
              autocomplete="username"
              value={username}
              onInput={(e) => setUsername(e.currentTarget.value)}
            />
          </label>
          <label>
            Password
            <input
              name="password"
              type="password"
              autocomplete="current-password"
              value={password}
              onInput={(e) => setPassword(e.currentTarget.value)}
            />
          </label>
          <button type="submit" class="primary" disabled={busy || !password}>
            {busy ? 'Logging in…' : 'Log in'}
          </button>
          <ErrorNote error={error} />
        </form>
      )}
    </main>
  )
}
