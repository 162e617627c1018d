-- `idx_status_created (status, created_at)` became `idx_created (created_at)`. Every SENT mark
-- (and every claim) changes `status`, so each index holding it moves an entry per row: the
-- server delete-marks the old one, inserts the new one and purges the old later. Of the three
-- that held it, this one served only operator work: cleanup and reconcile read SENT rows by
-- `created_at` and fetch each row anyway (the status is checked on it), and the counts by status
-- and the oldest PENDING row read `idx_pending (status)` (id implied: the lowest PENDING id).
-- Each status-holding index costs ~8-10 us of the server's CPU per marked row (MariaDB 10.11,
-- 1,000-row SENT marks of 1 KiB rows; DEVELOPMENT.md, 2026-12-05 late evening).
-- Two statements: each is skipped where it is done already (an adopted table gets
-- `idx_created` from the adoption, and may never have had `idx_status_created`).
ALTER TABLE outbox_event ADD INDEX idx_created (created_at);
ALTER TABLE outbox_event DROP INDEX idx_status_created;
