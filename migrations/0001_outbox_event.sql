-- The outbox: business code inserts one row per event in its own transaction.
-- status: 0 PENDING, 1 SENDING (claimed by a sweeper/poller under a lease), 2 SENT, 3 FAILED.
-- Valid on MySQL 8.0+ and MariaDB 10.6+ (where JSON is LONGTEXT with a json_valid check).
CREATE TABLE IF NOT EXISTS outbox_event (
  id            BIGINT        NOT NULL AUTO_INCREMENT,
  event_id      VARCHAR(64)   NOT NULL,
  biz_key       VARCHAR(64)   NOT NULL,
  topic         VARCHAR(127)  NOT NULL,
  tags          VARCHAR(128)  NULL,
  headers       JSON          NULL,
  payload       JSON          NOT NULL,
  status        TINYINT       NOT NULL DEFAULT 0,
  retry_count   INT           NOT NULL DEFAULT 0,
  next_retry_at DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  lease_until   DATETIME(3)   NULL,
  owner         VARCHAR(128)  NULL,
  msg_id        VARCHAR(128)  NULL,
  sent_at       DATETIME(3)   NULL,
  last_error    VARCHAR(1024) NULL,
  created_at    DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at    DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_event_id (event_id),
  -- sweeper / poller claim: WHERE status = 0 AND next_retry_at <= NOW(3) ORDER BY id
  KEY idx_claim (status, next_retry_at, id),
  -- lease recovery: WHERE status = 1 AND lease_until < NOW(3)
  KEY idx_lease (status, lease_until),
  -- oldest PENDING, cleanup of old SENT rows: WHERE status = ? AND created_at < ?
  KEY idx_status_created (status, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
