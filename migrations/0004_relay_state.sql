-- One row per relay deployment (`relay.name`): the checkpoint mirror that lets another instance
-- resume, and the leader lease that lets exactly one instance tail the binlog.
CREATE TABLE IF NOT EXISTS outbox_relay_state (
  name           VARCHAR(64)  NOT NULL,
  checkpoint     TEXT         NULL,
  checkpoint_at  DATETIME(3)  NULL,
  leader         VARCHAR(128) NULL,
  leader_epoch   BIGINT       NOT NULL DEFAULT 0,
  lease_until    DATETIME(3)  NULL,
  updated_at     DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
