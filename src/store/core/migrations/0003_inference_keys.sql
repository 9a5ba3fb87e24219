-- inference_keys: the inference API keys an operator created (POST /api/keys), never their secrets:
-- `digest` is the SHA-256 (hex) of the secret, which was shown once when the key was created.
-- `version` (Unix ms of the last change) orders changes across the pods of a cluster (the newer
-- record wins); a revoked key stays as a tombstone (`revoked_at` set) so that its revocation reaches
-- every pod and a late copy of the key can never bring it back.
CREATE TABLE inference_keys (
  id TEXT PRIMARY KEY NOT NULL,
  name TEXT NOT NULL,
  digest TEXT NOT NULL,
  models TEXT,
  rpm INTEGER,
  tpm INTEGER,
  max_concurrent INTEGER,
  budget_tokens INTEGER,
  budget_period TEXT,
  priority TEXT NOT NULL DEFAULT 'normal',
  expires_at INTEGER,
  created_at INTEGER NOT NULL,
  version INTEGER NOT NULL,
  revoked_at INTEGER
);
CREATE UNIQUE INDEX inference_keys_digest ON inference_keys (digest);

-- inference_key_usage: requests and the engine's token counts per key, model and UTC hour (`hour`:
-- Unix ms of the hour's start). Written in batches off the request path (at most a second behind).
CREATE TABLE inference_key_usage (
  key_id TEXT NOT NULL,
  model TEXT NOT NULL,
  hour INTEGER NOT NULL,
  requests INTEGER NOT NULL DEFAULT 0,
  prompt_tokens INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0,
  errors INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (key_id, model, hour)
);
CREATE INDEX inference_key_usage_hour ON inference_key_usage (hour);
