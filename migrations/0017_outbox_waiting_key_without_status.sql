-- `idx_waiting_key (topic, biz_key, status)` becomes `(topic, biz_key)` (id implied): every
-- SENT mark (and every claim) changes `status`, and each index holding it moves an entry per
-- row (a delete-mark, an insert, a purge later): ~8-10 µs of the server's CPU per marked row on
-- MariaDB 10.11, ~14-17 µs on MySQL 9.7 (docs/development/performance-journal.md, "Where a SENT
-- mark's database CPU goes"). Only `idx_pending (status, topic)` holds it now. The key-order
-- question reads a key's rows from the first waiting row of its topic (one dive of
-- `idx_pending` per topic), checking `status` on the rows: a few recent rows per key, and never
-- another topic's backlog (each topic is known clean on its own).
-- Only the relay's own form is changed; the statement is chosen from `information_schema`, so
-- it runs where the index is exactly `(topic, biz_key, status)` and does nothing elsewhere.
SET @outbox_waiting_key = (SELECT IF(GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) = 'topic,biz_key,status', 'ALTER TABLE outbox_event DROP INDEX idx_waiting_key, ADD INDEX idx_waiting_key (topic, biz_key)', 'DO 0') FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_event' AND INDEX_NAME = 'idx_waiting_key');
PREPARE outbox_waiting_key FROM @outbox_waiting_key;
EXECUTE outbox_waiting_key;
DEALLOCATE PREPARE outbox_waiting_key;
