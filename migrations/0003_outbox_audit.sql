-- Every manual compensation (retry, resend, mark-failed) leaves one row: who, why, what changed.
CREATE TABLE IF NOT EXISTS outbox_audit (
  id           BIGINT        NOT NULL AUTO_INCREMENT,
  operator     VARCHAR(128)  NOT NULL,
  reason       VARCHAR(1024) NOT NULL,
  action       VARCHAR(32)   NOT NULL,
  outbox_table VARCHAR(130)  NOT NULL,
  event_id     VARCHAR(64)   NULL,
  before_state JSON          NULL,
  after_state  JSON          NULL,
  result       VARCHAR(255)  NOT NULL,
  created_at   DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_event (event_id),
  KEY idx_created (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
