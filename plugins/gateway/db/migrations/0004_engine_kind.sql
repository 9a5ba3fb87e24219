ALTER TABLE gateway_instances ADD COLUMN engine_kind TEXT NOT NULL DEFAULT 'vllm';
