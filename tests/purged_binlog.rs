//! The checkpoint purged from the server (`PURGE BINARY LOGS` while the relay was down): the relay
//! logs an ERROR, counts it, restarts from the oldest binlog the server has, and the sweeper
//! publishes the rows written in the gap, before
//! the later events of their keys (the stream holds those keys meanwhile). On MySQL (GTIDs on) the server refuses the dump of a
//! checkpoint that lacks part of `gtid_purged`, and the relay restarts from `gtid_purged`. On a
//! server of its own: purging binlogs would disturb the tests sharing the suite's server.

use crate::common;

use common::relay::{
    assert_every_event_arrived_in_key_order, current_position, purge_all_but_the_newest_binlog,
    seed_checkpoint, sweeping_config, wait_until_sent, write_events, RunningRelay,
};
use common::rocketmq::new_topic;
use common::TestDb;
use mysql_async::prelude::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_checkpoint_falls_back_to_the_oldest_binlog_and_the_gap_is_swept() {
    let server = common::own_database("purged");
    let db = TestDb::migrated_on(&server, "purged").await;
    let topic = new_topic("purged");
    let (mut config, _dir) = sweeping_config(&db);
    // Long enough that the streamed events after the restart would overtake the gap's rows of
    // their keys, if the stream did not hold those keys until the gap's rows are sent.
    config.sweeper.min_age = Duration::from_secs(5);
    seed_checkpoint(&config, &current_position(&db).await);

    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 2, 50, 10).await;
    wait_until_sent(&db, 100, Duration::from_secs(60)).await;
    relay.stop().await;

    // While the relay is down: 200 more events, then their binlogs are purged.
    write_events(&db, &topic, 2, 100, 10).await;
    let mut conn = db.conn().await;
    conn.query_drop("FLUSH BINARY LOGS").await.unwrap();
    purge_all_but_the_newest_binlog(&db).await;
    let lost_before = rocketmq_outbox::metrics::relay().binlog_position_lost.get();

    let relay = RunningRelay::start(&config).await;
    // New events after the restart stream as usual.
    write_events(&db, &topic, 2, 25, 10).await;
    wait_until_sent(&db, 350, Duration::from_secs(90)).await;
    let lost = rocketmq_outbox::metrics::relay().binlog_position_lost.get() - lost_before;
    assert!(lost >= 1, "the lost position is counted for alerting");
    relay.stop().await;

    // Every event arrived, each key in commit order across the gap (contract 4).
    assert_every_event_arrived_in_key_order(&db, &topic, 350).await;
}
