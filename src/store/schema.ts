import { index, integer, sqliteTable, text } from 'drizzle-orm/sqlite-core'
import type { Migration } from './db.ts'
import oauthUsedStatesSql from './migrations/0002_oauth_used_states.sql' with { type: 'text' }

/**
 * The host's own tables (the plugins keep theirs in plugins/<id>/db). Their migrations run at boot
 * before any plugin's, under the owner `core`, embedded like the plugins' (imported as text).
 */
export const CORE_OWNER = 'core'

export const coreMigrations: Migration[] = [{ id: '0002_oauth_used_states', sql: oauthUsedStatesSql }]

/**
 * oauthUsedStates: the OAuth login states already presented to the callback, until their login
 * would have expired (src/http/oauth-states.ts), so single use survives a restart. It mirrors
 * migrations/0002_oauth_used_states.sql (test/store/migrations.test.ts fails when they differ).
 */
export const oauthUsedStates = sqliteTable(
  'oauth_used_states',
  {
    state: text('state').primaryKey().notNull(),
    /** When the login this state belongs to expires (Unix ms): the row may go once it has passed. */
    expires_at: integer('expires_at').notNull(),
  },
  (t) => [index('oauth_used_states_expires_at').on(t.expires_at)],
)
