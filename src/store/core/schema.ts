import { index, integer, primaryKey, sqliteTable, text, uniqueIndex } from 'drizzle-orm/sqlite-core'

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

/**
 * inferenceKeys: the inference API keys (src/http/keys/), by id, with their limits; `digest` is the
 * SHA-256 of the secret (the secret itself is never stored). `version` orders changes across pods;
 * a revoked key stays as a tombstone (`revoked_at`).
 */
export const inferenceKeys = sqliteTable(
  'inference_keys',
  {
    id: text('id').primaryKey().notNull(),
    name: text('name').notNull(),
    digest: text('digest').notNull(),
    /** The allowed model names (JSON array); null: every model. */
    models: text('models', { mode: 'json' }).$type<string[]>(),
    rpm: integer('rpm'),
    tpm: integer('tpm'),
    max_concurrent: integer('max_concurrent'),
    budget_tokens: integer('budget_tokens'),
    budget_period: text('budget_period').$type<'day' | 'month'>(),
    priority: text('priority').$type<'high' | 'normal' | 'low'>().notNull().default('normal'),
    /** Unix ms; null: never. */
    expires_at: integer('expires_at'),
    created_at: integer('created_at').notNull(),
    version: integer('version').notNull(),
    revoked_at: integer('revoked_at'),
  },
  (t) => [uniqueIndex('inference_keys_digest').on(t.digest)],
)

/** inferenceKeyUsage: requests and the engine's token counts per key, model and UTC hour (Unix ms). */
export const inferenceKeyUsage = sqliteTable(
  'inference_key_usage',
  {
    key_id: text('key_id').notNull(),
    model: text('model').notNull(),
    hour: integer('hour').notNull(),
    requests: integer('requests').notNull().default(0),
    prompt_tokens: integer('prompt_tokens').notNull().default(0),
    completion_tokens: integer('completion_tokens').notNull().default(0),
    errors: integer('errors').notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.key_id, t.model, t.hour] }), index('inference_key_usage_hour').on(t.hour)],
)
