-- Benchmark runs and their scenarios (plugin: benchmarks). Metrics are stored as JSON text.
CREATE TABLE benchmark_runs (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  status TEXT NOT NULL,
  mode TEXT NOT NULL,
  sharedcache_enabled INTEGER NOT NULL DEFAULT 0,
  created_at TEXT NOT NULL,
  started_at TEXT,
  completed_at TEXT,
  total_requests INTEGER NOT NULL DEFAULT 0,
  successful_requests INTEGER NOT NULL DEFAULT 0,
  failed_requests INTEGER NOT NULL DEFAULT 0,
  duration_seconds REAL,
  error TEXT
);
CREATE INDEX benchmark_runs_status_idx ON benchmark_runs (status);
CREATE INDEX benchmark_runs_created_idx ON benchmark_runs (created_at);

CREATE TABLE benchmark_scenarios (
  id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES benchmark_runs (id) ON DELETE CASCADE,
  position INTEGER NOT NULL,
  instance_id TEXT NOT NULL,
  routing_mode TEXT NOT NULL,
  model_path TEXT NOT NULL,
  model_name TEXT NOT NULL,
  input_tokens INTEGER NOT NULL,
  output_tokens INTEGER NOT NULL,
  concurrency INTEGER NOT NULL,
  warmup_requests INTEGER NOT NULL,
  total_requests INTEGER NOT NULL,
  sla_threshold_ms REAL,
  sla_ttft_ms REAL,
  sla_tpot_ms REAL,
  request_rate REAL,
  status TEXT NOT NULL,
  phase TEXT NOT NULL DEFAULT 'queued',
  started_at TEXT,
  completed_at TEXT,
  warmup_completed INTEGER NOT NULL DEFAULT 0,
  completed_requests INTEGER NOT NULL DEFAULT 0,
  successful_requests INTEGER NOT NULL DEFAULT 0,
  failed_requests INTEGER NOT NULL DEFAULT 0,
  prompt_tokens INTEGER,
  prompt_source TEXT,
  prompt_note TEXT,
  error TEXT,
  metrics TEXT
);
CREATE INDEX benchmark_scenarios_run_idx ON benchmark_scenarios (run_id, position);
