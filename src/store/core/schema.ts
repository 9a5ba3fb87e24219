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
