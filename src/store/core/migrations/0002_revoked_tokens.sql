-- revoked_tokens: admin JWTs logged out before they expire, by their `jti`, kept until `expires_at`
-- (the token's exp, Unix seconds), so a restart does not bring a logged-out token back. Rows past
-- expires_at are purged as new ones arrive (the token is refused as expired by then anyway).
CREATE TABLE revoked_tokens (
  jti TEXT PRIMARY KEY NOT NULL,
  expires_at INTEGER NOT NULL
);
CREATE INDEX revoked_tokens_expires_at ON revoked_tokens (expires_at);
