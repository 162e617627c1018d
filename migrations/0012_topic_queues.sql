-- The queue list each topic's keys are hashed over, per relay deployment (`relay.name`): every
-- RocketMQ broker group seen serving the topic, with its write queue count. An instance that
-- starts, or takes over, while a group is down reads that group's queues here, so its keys keep
-- their queue and wait for it instead of moving to another group's queue.
CREATE TABLE IF NOT EXISTS outbox_topic_queues (
  relay         VARCHAR(64)  NOT NULL,
  topic         VARCHAR(255) NOT NULL,
  broker_group  VARCHAR(255) NOT NULL,
  write_queues  INT          NOT NULL,
  updated_at    DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (relay, topic, broker_group)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
