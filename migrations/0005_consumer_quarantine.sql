-- Consumer side: messages a consumer group could never process (a bad event, or one without a
-- dedup key). Each row keeps the whole message so it can be inspected and replayed by hand; the
-- message itself was ACKed so it is not redelivered forever. For events with a key the matching
-- event_dedup row has status REJECTED and is written in the same transaction.
-- payload is LONGTEXT, not JSON: a rejected payload may be invalid JSON (or not even UTF-8, in
-- which case it is stored with replacement characters and the reason says so).
CREATE TABLE IF NOT EXISTS consumer_quarantine (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  consumer_group  VARCHAR(128)  NOT NULL,
  event_id        VARCHAR(191)  NULL,
  topic           VARCHAR(127)  NOT NULL,
  msg_id          VARCHAR(128)  NULL,
  message_keys    VARCHAR(1024) NULL,
  tags            VARCHAR(255)  NULL,
  properties      JSON          NULL,
  payload         LONGTEXT      NULL,
  reason          TEXT          NOT NULL,
  reconsume_times INT           NOT NULL DEFAULT 0,
  created_at      DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_group_event (consumer_group, event_id),
  KEY idx_created (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
