-- Poll mode and the sweeper claim rows with SKIP LOCKED; to keep a key's events in order they
-- look up the older rows of the claimed keys that are still waiting: WHERE biz_key IN (...)
-- AND id < ?. (Tables created LIKE outbox_event before this migration need the same index.)
ALTER TABLE outbox_event ADD INDEX idx_key_order (biz_key, id);
