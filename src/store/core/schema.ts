import { index, integer, sqliteTable, text } from 'drizzle-orm/sqlite-core'

/**
 * core/schema.ts: the tables the core (not a plugin) owns. They mirror core/migrations/*.sql
 * (test/store/migrations.test.ts fails when they differ).
 *
 * revokedTokens: the admin JWTs logged out before their expiry, by jti, until that expiry
 * (src/http/revocations.ts), so a logout survives a restart.
 */
export const revokedTokens = sqliteTable(
  'revoked_tokens',
  {
    jti: text('jti').primaryKey().notNull(),
    /** The token's exp (Unix seconds): the row may go once it has passed. */
    expires_at: integer('expires_at').notNull(),
  },
  (t) => [index('revoked_tokens_expires_at').on(t.expires_at)],
)

/**
 * oauthUsedStates: the OAuth login states already presented to the callback, until their login
 * would have expired (src/http/oauth-states.ts), so single use survives a restart.
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
