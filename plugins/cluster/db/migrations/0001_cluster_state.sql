-- cluster_state: what a pod must remember across restarts: the highest leader term it has seen
-- (fencing: a command under a lower term is refused) and the last routing table it adopted (a pod
-- that lost its leader keeps serving with it).
CREATE TABLE cluster_state (
  key TEXT PRIMARY KEY NOT NULL,
  value TEXT NOT NULL,
  updated_at TEXT NOT NULL
);
