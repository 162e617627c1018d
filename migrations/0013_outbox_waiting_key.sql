-- The key-order guard asks, for the keys it is about to send, which older rows of each key still
-- wait (PENDING or SENDING). Through `idx_pending (status)` that walked every waiting row below
-- the newest id, whatever its key: with a topic stuck for minutes its whole parked backlog, on
-- every dispatcher batch (25 ms at 6k parked rows, growing without bound; the healthy topics'
-- latency grew with it). `(topic, biz_key, status)` (id implied) reads only the waiting rows of
-- the keys asked about. It replaces `idx_key_order (biz_key, id)`, which no query uses since the
-- guard moved to `idx_pending`.
-- Two statements: each is skipped where it is done already (an adopted table gets the new index
-- from the adoption, and may never have had the old one).
ALTER TABLE outbox_event ADD INDEX idx_waiting_key (topic, biz_key, status);
ALTER TABLE outbox_event DROP INDEX idx_key_order;
