import type { Migration } from '../db.ts'
import oauthUsedStatesSql from './migrations/0001_oauth_used_states.sql' with { type: 'text' }
import revokedTokensSql from './migrations/0002_revoked_tokens.sql' with { type: 'text' }
import inferenceKeysSql from './migrations/0003_inference_keys.sql' with { type: 'text' }

/**
 * The core's own tables, migrated by the host at boot before any plugin's, under the owner
 * CORE_OWNER in `_migrations` (where each plugin's owner is its id). The SQL is imported as text so
 * the compiled binary carries it, like the plugins' migrations.
 */
export const CORE_OWNER = 'core'

export const coreMigrations: readonly Migration[] = [
  { id: 'core_0001_oauth_used_states', sql: oauthUsedStatesSql },
  { id: 'core_0002_revoked_tokens', sql: revokedTokensSql },
  { id: 'core_0003_inference_keys', sql: inferenceKeysSql },
]
