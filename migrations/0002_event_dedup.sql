-- Consumer side: one row per event a consumer group has finished with. The primary key is the
-- physical guarantee of idempotency; it is written in the same transaction as the business change.
-- status: PROCESSED (handled) or REJECTED (never processable; quarantined, not redelivered).
CREATE TABLE IF NOT EXISTS event_dedup (
  consumer_group VARCHAR(128) NOT NULL DEFAULT '',
  event_id       VARCHAR(191) NOT NULL,
  status         VARCHAR(16)  NOT NULL,
  topic          VARCHAR(127) NULL,
  msg_id         VARCHAR(128) NULL,
  created_at     DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (consumer_group, event_id),
  KEY idx_created (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
