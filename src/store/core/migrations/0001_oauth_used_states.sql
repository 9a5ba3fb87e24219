-- oauth_used_states: every OAuth `state` already presented to the login callback, kept until the
-- login it belongs to would have expired (expires_at, Unix ms), so a replayed callback URL with its
-- cookie is refused after a restart too. Rows past expires_at are purged as new ones arrive.
CREATE TABLE oauth_used_states (
  state TEXT PRIMARY KEY NOT NULL,
  expires_at INTEGER NOT NULL
);
CREATE INDEX oauth_used_states_expires_at ON oauth_used_states (expires_at);
