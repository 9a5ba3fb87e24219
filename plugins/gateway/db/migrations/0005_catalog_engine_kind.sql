ALTER TABLE gateway_catalog ADD COLUMN engine_kind TEXT;
