-- `idx_lease (status, lease_until)` served one query: the lease recovery's
-- `WHERE status = 1 AND lease_until < NOW(3)`. SENDING rows are only those claimed and in
-- flight (a few claim batches), so `idx_pending (status)` finds them as cheaply; meanwhile every
-- claim, SENT mark and lease renewal had to move an entry in `idx_lease`. What is left with
-- `status` first: `idx_pending` (claims, lease recovery) and `idx_status_created` (oldest PENDING
-- metric, cleanup, reconcile, status counts).
ALTER TABLE outbox_event DROP INDEX idx_lease;
