-- `outbox-relay reconcile`: events SENT by the relay that a consumer group has not recorded in
-- event_dedup, as a work queue. One row per (consumer group, outbox table, event_id): repeated
-- runs update last_run_id / last_checked_at instead of adding rows; resolved_at is set when a
-- later run finds the event downstream (or by whoever handled it).
CREATE TABLE IF NOT EXISTS outbox_reconcile_diff (
  id              BIGINT        NOT NULL AUTO_INCREMENT,
  consumer_group  VARCHAR(128)  NOT NULL,
  outbox_table    VARCHAR(130)  NOT NULL,
  event_id        VARCHAR(64)   NOT NULL,
  topic           VARCHAR(127)  NOT NULL,
  hour_start      DATETIME      NOT NULL,
  sent_at         DATETIME(3)   NULL,
  run_id          VARCHAR(64)   NOT NULL,
  last_run_id     VARCHAR(64)   NOT NULL,
  found_at        DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  last_checked_at DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  resolved_at     DATETIME(3)   NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_group_table_event (consumer_group, outbox_table, event_id),
  -- the open work queue: WHERE resolved_at IS NULL ORDER BY hour_start
  KEY idx_open (resolved_at, hour_start)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
