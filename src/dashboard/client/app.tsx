import clients from 'modelgate:dashboard-clients'
import { signal } from '@preact/signals'
import { useEffect } from 'preact/hooks'
import { api } from './api.ts'
import { Denied } from './components/denied.tsx'
import { ErrorNote } from './components/error-note.tsx'
import { Login } from './components/login.tsx'
import { connection, startLive } from './live.ts'
import type { PageComponent } from './page.ts'
import { hostClient } from './pages/index.ts'
import { href, match, path } from './router.ts'
import { canWrite, logout, session, startSession } from './session.ts'
import type { AuthInfo, DashboardPages, Me } from './types.ts'

/** listed: the pages of the plugins that are on, as the server lists them (null until it said). */
const listed = signal<DashboardPages | null>(null)

/** components: every page's view by id, from the host and each compiled-in plugin's client module. */
const components: ReadonlyMap<string, PageComponent> = new Map(
  [hostClient, ...clients].flatMap((c) => Object.entries(c.pages)),
)

/**
 * App: the shell. Before a session it shows the login (or the access-denied page); once logged in,
 * the navigation built from the page registry, who is logged in, whether the live stream is up, and
 * the page the URL fragment names.
 */
function Shell({ info, user }: { info: AuthInfo; user: Me }) {
  useEffect(() => startLive(), [])
  useEffect(() => {
    api
      .pages()
      .then((l) => {
        listed.value = l
      })
      .catch(() => {
        listed.value = { pages: [], off: [] }
      })
  }, [])
  const p = path.value
  const shown = listed.value?.pages ?? []
  const found = shown.map((page) => ({ page, params: match(page.path, p) })).find((m) => m.params)
  const off = found ? null : (listed.value?.off.find((o) => match(o.path, p))?.plugin ?? null)
  useEffect(() => {
    document.title = `${found?.page.title ?? (listed.value ? 'Not found' : 'Loading')} · modelgate`
  }, [found?.page.title, listed.value])
  const Current = found ? components.get(found.page.id) : undefined
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
                found?.page.id === page.id || found?.page.path.startsWith(`${page.path}/`) ? 'active' : ''
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
          <h1>{found?.page.title ?? (listed.value ? 'Not found' : '')}</h1>
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
        ) : !listed.value ? (
          <p class="muted">Loading…</p>
        ) : Current ? (
          <Current params={found?.params ?? {}} />
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
