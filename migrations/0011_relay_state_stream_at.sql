-- How far the leader's stream had read when it last mirrored its checkpoint: the commit time of
-- the newest transaction read (server clock), or the time of a heartbeat once the server had
-- nothing more to send. Standby sweepers claim only rows older than this minus
-- `sweeper.min_age`; with `checkpoint_at` (when the mirror was written) they raced a leader
-- catching up on a backlog and sent it twice.
ALTER TABLE outbox_relay_state ADD COLUMN stream_at DATETIME(3) NULL AFTER checkpoint_at;
