import { signal } from '@preact/signals'
import { useEffect } from 'preact/hooks'
import { api } from './api.ts'
import { Denied } from './components/denied.tsx'
import { ErrorNote } from './components/error-note.tsx'
import { Login } from './components/login.tsx'
import { connection, startLive } from './live.ts'
import { pages } from './pages/index.ts'
import { href, match, path } from './router.ts'
import { canWrite, logout, session, startSession } from './session.ts'
import type { AuthInfo, Me } from './types.ts'

/** features: the optional plugins that are on (null until the gateway said). */
const features = signal<Set<string> | null>(null)

/**
 * App: the shell. Before a session it shows the login (or the access-denied page); once logged in,
 * the navigation built from the page registry, who is logged in, whether the live stream is up, and
 * the page the URL fragment names.
 */
function Shell({ info, user }: { info: AuthInfo; user: Me }) {
  useEffect(() => startLive(), [])
  useEffect(() => {
    api
      .features()
      .then((f) => {
        features.value = new Set(f.plugins)
      })
      .catch(() => {
        features.value = new Set()
      })
  }, [])
  const p = path.value
  const on = features.value
  const shown = pages.filter((page) => !page.requires || on?.has(page.requires))
  const found = pages.map((page) => ({ page, params: match(page.path, p) })).find((m) => m.params)
  const off = found?.page.requires && on && !on.has(found.page.requires) ? found.page.requires : null
  useEffect(() => {
    document.title = `${found?.page.title ?? 'Not found'} · modelgate`
  }, [found?.page.title])
  const Current = found?.page.component
  return (
    <div class="shell">
      <nav class="nav" aria-label="Pages">
        <a class="brand" href={href('/')}>
          modelgate
        </a>
        {shown
          .filter((page) => page.nav)
          .map((page) => (
            <a
              key={page.id}
              href={href(page.path)}
              class={
                found?.page.id === page.id || (page.id === 'models' && found?.page.id === 'instance')
                  ? 'active'
                  : ''
              }
            >
              {page.nav}
            </a>
          ))}
        <a class="docs" href="/docs">
          API docs
        </a>
      </nav>
      <div class="main">
        <header class="top">
          <h1>{found?.page.title ?? 'Not found'}</h1>
          <span class={`conn ${connection.value}`} title="the event stream">
            {connection.value === 'live'
              ? 'live'
              : connection.value === 'down'
                ? 'reconnecting'
                : 'connecting'}
          </span>
          <span class="who" data-role={canWrite.value ? 'admin' : 'admin-readonly'}>
            {user.username} <span class="muted">({canWrite.value ? 'admin' : 'read-only'})</span>
          </span>
          {info.auth_enabled && (
            <button type="button" onClick={() => logout()}>
              Log out
            </button>
          )}
        </header>
        {off ? (
          <p class="muted note">
            The {off} plugin is not enabled on this gateway (plugins.{off} in its YAML).
          </p>
        ) : found?.page.requires && !on ? (
          <p class="muted">Loading…</p>
        ) : Current ? (
          <Current params={found.params ?? {}} />
        ) : (
          <p class="muted">No page at {p}.</p>
        )}
      </div>
    </div>
  )
}

export function App() {
  const s = session.value
  switch (s.phase) {
    case 'loading':
      return <p class="muted center">Loading…</p>
    case 'unreachable':
      return (
        <main class="login card">
          <h1>modelgate</h1>
          <ErrorNote error={s.error} />
          <button type="button" onClick={() => startSession()}>
            Try again
          </button>
        </main>
      )
    case 'login':
      return <Login info={s.info} notice={s.notice} />
    case 'denied':
      return <Denied info={s.info} user={s.user} />
    case 'ready':
      return <Shell info={s.info} user={s.user} />
  }
}
