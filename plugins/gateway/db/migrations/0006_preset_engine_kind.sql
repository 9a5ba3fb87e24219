ALTER TABLE gateway_preset_entries ADD COLUMN engine_kind TEXT;
