-- A scheduled event's delivery time: NULL (most events) means at once. The relay sends such an
-- event at once, as a RocketMQ 5 timer message (`TIMER_DELIVER_MS`) to a DELAY topic, and the
-- broker hands it to consumers from that time on. A TIMESTAMP, so the instant is the same for
-- the producer, the binlog and the relay whatever their session time zones.
-- Skipped where it is done already (an adopted table gets the column from the adoption).
ALTER TABLE outbox_event ADD COLUMN deliver_at TIMESTAMP(3) NULL DEFAULT NULL;
