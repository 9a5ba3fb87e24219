CREATE TABLE gateway_catalog (
  name TEXT PRIMARY KEY NOT NULL,
  model_path TEXT NOT NULL,
  max_tokens INTEGER,
  tensor_parallel_size INTEGER NOT NULL,
  gpu_memory_utilization REAL,
  enable_sleep_mode INTEGER NOT NULL,
  extra_args TEXT NOT NULL,
  gpu_ids TEXT,
  pin INTEGER NOT NULL,
  preload INTEGER NOT NULL,
  updated_at TEXT NOT NULL
);
ALTER TABLE gateway_instances ADD COLUMN evictable INTEGER NOT NULL DEFAULT 0;
