//! The CDC relay end to end: real MariaDB or MySQL binlog (`OUTBOX_TEST_DB`) → relay → real
//! RocketMQ broker → a consumer.

use crate::common;

use common::relay::{
    assert_every_event_arrived_in_key_order, count_status, relay_fixture, wait_until_sent,
    write_events, RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use outbox_devenv::TopicReader;
use std::collections::HashSet;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_event_arrives_in_key_order_and_is_marked_sent() {
    let db = TestDb::migrated("relay_e2e").await;
    let topic = new_topic("relay_e2e");
    let (config, _dir) = relay_fixture(&db).at_current_end().await;
    let relay = RunningRelay::start(&config).await;

    const TOTAL: usize = 10_000;
    write_events(&db, &topic, 4, TOTAL / 4, 500).await;
    wait_until_sent(&db, TOTAL as u64, Duration::from_secs(180)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.sent, TOTAL as u64);
    assert_eq!(summary.marked.failed, 0);

    assert_every_event_arrived_in_key_order(&db, &topic, TOTAL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_stay_pending_while_the_relay_is_stopped_and_flow_after_it_starts() {
    let db = TestDb::migrated("relay_stopped").await;
    let topic = new_topic("relay_stopped");
    let (config, _dir) = relay_fixture(&db).at_current_end().await;
    write_events(&db, &topic, 1, 50, 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Pending).await,
        50,
        "nothing sends them while the relay is down"
    );

    let relay = RunningRelay::start(&config).await;
    wait_until_sent(&db, 50, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.sent, 50);
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &topic)
        .await
        .unwrap();
    let messages = reader.read_all_for(Duration::from_secs(2)).await.unwrap();
    let ids: HashSet<String> = messages
        .iter()
        .map(|m| m.properties["event_id"].clone())
        .collect();
    assert_eq!(ids.len(), 50);
    assert_eq!(messages.len(), 50, "one message per event_id");
    reader.close().await;
}
