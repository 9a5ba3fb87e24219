import { loginWithProvider, logout } from '../session.ts'
import type { AuthInfo, Me } from '../types.ts'

/**
 * Denied: the access-denied page for a user the gateway knows but who holds neither role: it names
 * the groups that grant each role (OAuth mode) and offers to log in again once added to one.
 */
export function Denied({ info, user }: { info: AuthInfo; user: Me }) {
  const groups = info.oauth?.groups
  const list = (gs: string[]) => gs.map((g, i) => [i > 0 ? ' or ' : '', <code key={g}>{g}</code>])
  return (
    <main class="login card" data-view="denied">
      <h1>Access denied</h1>
      <p>
        You are logged in as <b>{user.username}</b>, but modelgate needs you to hold the <b>admin</b> or{' '}
        <b>admin-readonly</b> role.
      </p>
      {groups && (
        <ul>
          {groups.admin.length > 0 && <li>{list(groups.admin)} for the admin role</li>}
          {groups['admin-readonly'].length > 0 && (
            <li>{list(groups['admin-readonly'])} for the admin-readonly role</li>
          )}
        </ul>
      )}
      <p>Ask a cluster administrator to add you to one of these groups, then try again.</p>
      <button
        type="button"
        class="primary"
        onClick={async () => {
          await logout()
          if (info.mode === 'oauth') loginWithProvider()
        }}
      >
        Try again
      </button>
    </main>
  )
}
