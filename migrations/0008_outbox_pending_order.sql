-- Poll mode and the sweeper claim PENDING rows in id order: WHERE status = 0 ... ORDER BY id
-- LIMIT n. An index on (status) is (status, id) in InnoDB, so the claim walks only PENDING rows
-- in id order; without it the optimizer scanned the primary key past every SENT row, and poll
-- mode slowed down as SENT rows piled up (the benchmark: 3k/s falling to 0.6k/s over 200k rows).
ALTER TABLE outbox_event ADD INDEX idx_pending (status);
