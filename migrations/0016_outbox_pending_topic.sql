-- `idx_pending (status)` becomes `(status, topic)` (id implied). Claims read it one topic at a
-- time, in id order (the topics with PENDING rows are one dive each: a loose index scan), so a
-- stalled topic's parked rows are never read by a claim: through `(status)` each claim from the
-- first PENDING row read all of them to leave them out, 63,000 rows after a 5-minute stall at
-- 200 events/s. The entry a SENT mark moves is the same one as before.
-- Only the relay's own form is changed: an `idx_pending` of other columns (the reference
-- article's `(status, next_retry_at)`, kept by adoption) stays as it is, and `migrate --plan`
-- says how to match it. The statement is chosen from `information_schema`, so it runs where the
-- index is exactly `(status)` and does nothing elsewhere (a second run included).
SET @outbox_pending_topic = (SELECT IF(GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) = 'status', 'ALTER TABLE outbox_event DROP INDEX idx_pending, ADD INDEX idx_pending (status, topic)', 'DO 0') FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_event' AND INDEX_NAME = 'idx_pending');
PREPARE outbox_pending_topic FROM @outbox_pending_topic;
EXECUTE outbox_pending_topic;
DEALLOCATE PREPARE outbox_pending_topic;
