-- Least-privilege users for outbox-relay (MySQL 8.0+; MariaDB: same grants, REPLICATION SLAVE
-- is spelled the same, REPLICATION CLIENT is BINLOG MONITOR on 10.5+).

-- The relay: reads the binlog as a replica, reads and updates the outbox, keeps its state row.
CREATE USER IF NOT EXISTS 'outbox_relay'@'%' IDENTIFIED BY 'relay-password';
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'outbox_relay'@'%';
GRANT SELECT, UPDATE ON app.outbox_event TO 'outbox_relay'@'%';
GRANT SELECT, INSERT, UPDATE ON app.outbox_relay_state TO 'outbox_relay'@'%';
GRANT SELECT, INSERT, DELETE ON app.outbox_topic_queues TO 'outbox_relay'@'%';
GRANT SELECT, INSERT, UPDATE, DELETE ON app.outbox_audit TO 'outbox_relay'@'%';
-- Optional: lets the relay log its own UPDATEs with binlog_row_image=MINIMAL per session
-- (relay.minimal_row_image); without it the relay warns and keeps FULL images for them.
-- MySQL: SESSION_VARIABLES_ADMIN. MariaDB: BINLOG ADMIN instead (it also allows PURGE BINARY
-- LOGS, so weigh it).
GRANT SESSION_VARIABLES_ADMIN ON *.* TO 'outbox_relay'@'%';

-- Migrations run with the application owner (root here); business code writes outbox rows with
-- its own user, which needs INSERT on app.outbox_event.
CREATE USER IF NOT EXISTS 'app'@'%' IDENTIFIED BY 'app-password';
GRANT SELECT, INSERT, UPDATE, DELETE ON app.* TO 'app'@'%';
