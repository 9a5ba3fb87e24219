CREATE TABLE gateway_presets (
  id TEXT PRIMARY KEY NOT NULL,
  name TEXT NOT NULL,
  description TEXT,
  created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL
);
CREATE UNIQUE INDEX gateway_presets_name ON gateway_presets (name COLLATE NOCASE);
CREATE TABLE gateway_preset_entries (
  id TEXT PRIMARY KEY NOT NULL,
  preset_id TEXT NOT NULL REFERENCES gateway_presets (id) ON DELETE CASCADE,
  model_path TEXT NOT NULL,
  served_model_name TEXT NOT NULL,
  max_tokens INTEGER,
  source_type TEXT NOT NULL,
  gpu_ids TEXT NOT NULL,
  tensor_parallel_size INTEGER NOT NULL,
  extra_args TEXT NOT NULL,
  enable_sleep_mode INTEGER NOT NULL,
  gpu_memory_utilization REAL,
  load_order INTEGER NOT NULL
);
CREATE INDEX gateway_preset_entries_preset ON gateway_preset_entries (preset_id, load_order);
CREATE TABLE gateway_memory_profiles (
  id TEXT PRIMARY KEY NOT NULL,
  profile_name TEXT NOT NULL,
  model_path TEXT NOT NULL,
  max_tokens INTEGER NOT NULL,
  total_gpu_memory_gib REAL NOT NULL,
  weights_memory_gib REAL NOT NULL,
  cuda_graphs_gib REAL NOT NULL,
  overhead_memory_gib REAL NOT NULL,
  kv_cache_available_gib REAL NOT NULL,
  gpu_name TEXT NOT NULL,
  gpu_total_memory_gib REAL NOT NULL,
  tensor_parallel_size INTEGER NOT NULL,
  gpu_memory_utilization REAL,
  source TEXT NOT NULL,
  comments TEXT,
  created_at TEXT NOT NULL
);
CREATE INDEX gateway_memory_profiles_key
  ON gateway_memory_profiles (model_path, gpu_name, max_tokens, tensor_parallel_size, created_at);
