//! A key never overtakes itself when its topic's queue count changes while the key's older
//! events wait in a lane. On a cluster of two broker groups, broker-b's queues of a topic are
//! made read-only (`mqadmin updateTopicPerm -b`, what an operator does to drain a group before
//! retiring it): the keys of its queues wait in lanes; 30 s later (the relay's `LEAVE_AFTER`)
//! the group leaves the topic's queue list, which shrinks from 8 queues to 4, so those keys now
//! hash to broker-a's queues, where nothing holds them back. Their new events must queue behind
//! the older ones still waiting, not go out at once. Judged by what the brokers stored. Apache
//! RocketMQ only (each test starts its own cluster).

use crate::cluster::{assert_delivered, config_on, two_groups};
use crate::common;
use crate::isolation::{assert_healthy_latency_kept, SteadyLoad};
use common::relay::RunningRelay;
use common::relay::{count_status, current_position, seed_checkpoint, wait_until_sent};
use common::TestDb;
use mysql_async::prelude::*;
use outbox_devenv::ReceivedMessage;
use rocketmq_outbox::outbox::Status;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_never_overtakes_itself_when_a_read_only_group_leaves_its_topic() {
    common::init_logging();
    let db = TestDb::migrated("queue_count").await;
    let mq = two_groups("queue-count");
    let topic = "queue_count";
    // Four queues on each group: keys hash over eight.
    mq.create_topic(topic, 4).unwrap();
    let (mut config, _dir) = config_on(&db, &mq);
    // The lanes keep what they hold for the whole test (nothing parks by age): the new events
    // meet the old ones in the lanes, not in the sweeper.
    config.relay.park_after = Duration::from_secs(300);
    config.sweeper.min_age = Duration::from_secs(1);
    config.sweeper.interval = Duration::from_millis(500);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    // Ten keys, 20 events/s: a key of broker-b gets about one event a second while it waits.
    let mut load = SteadyLoad::start(&db, [topic.to_string(), topic.to_string()], 20).await;

    tokio::time::sleep(Duration::from_secs(5)).await;
    let b = mq.broker_index("broker-b", 0).unwrap();
    let b_addr = format!("127.0.0.1:{}", mq.brokers()[b].port);
    mq.mqadmin(&["updateTopicPerm", "-b", &b_addr, "-t", topic, "-p", "4"])
        .expect("mqadmin updateTopicPerm");
    let read_only_at = load.elapsed().await;
    // The group leaves the list 30 s after the relay first sees it offer no writable queue;
    // then 10 s of the keys' new events on their new queues.
    tokio::time::sleep(Duration::from_secs(45)).await;
    let total = load.stop().await;
    wait_until_sent(&db, total, Duration::from_secs(120)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0, "nothing FAILED");
    assert_eq!(count_status(&db, Status::Failed).await, 0);

    let stored = assert_delivered(&db, &mq, topic).await;
    let ids = row_ids(&db, topic).await;
    assert_each_key_in_commit_order_across_queues(&stored, &ids);

    // The fault happened as described: broker-b's keys moved to broker-a's queues.
    let groups_of = groups_of_keys(&stored);
    let moved: Vec<&String> = (groups_of.iter())
        .filter(|(_, groups)| groups.len() > 1)
        .map(|(key, _)| key)
        .collect();
    println!(
        "queue count 8 -> 4 while broker-b's keys waited: {total} events, keys moved from \
         broker-b to broker-a: {moved:?}"
    );
    assert!(
        !moved.is_empty(),
        "no key moved from broker-b to broker-a: {groups_of:?}"
    );
    // broker-a's own keys kept flowing while broker-b's waited.
    let on_a = |key: &str| groups_of[key] == ["broker-a"];
    let before = load.latencies_of(topic, on_a, 1.0, read_only_at).await;
    let during = (load.latencies_of(topic, on_a, read_only_at + 2.0, read_only_at + 30.0)).await;
    assert_healthy_latency_kept(&before, &during, "broker group read-only");
}

/// Row id (commit order) of each event of `topic`.
async fn row_ids(db: &TestDb, topic: &str) -> HashMap<String, u64> {
    let rows: Vec<(u64, String)> = db
        .conn()
        .await
        .exec(
            "SELECT id, event_id FROM outbox_event WHERE topic = ?",
            (topic,),
        )
        .await
        .unwrap();
    rows.into_iter().map(|(id, event)| (event, id)).collect()
}

/// The broker groups each key's messages were stored on, in the order first used.
fn groups_of_keys(stored: &[ReceivedMessage]) -> BTreeMap<String, Vec<String>> {
    let mut sorted: Vec<&ReceivedMessage> = stored.iter().collect();
    sorted.sort_by_key(|m| m.store_timestamp);
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in sorted {
        let of_key = groups.entry(m.properties["biz_key"].clone()).or_default();
        if !of_key.contains(&m.broker_name) {
            of_key.push(m.broker_name.clone());
        }
    }
    groups
}

/// Per key, whatever queues its messages reached: the first copy of each event was stored no
/// earlier than the first copy of every older event of the key (brokers' store times, one clock
/// on this machine). [`assert_delivered`] checks the order within each queue.
fn assert_each_key_in_commit_order_across_queues(
    stored: &[ReceivedMessage],
    ids: &HashMap<String, u64>,
) {
    let mut first: BTreeMap<(&str, u64), i64> = BTreeMap::new();
    for m in stored {
        let id = ids[&m.properties["event_id"]];
        let at = first
            .entry((m.properties["biz_key"].as_str(), id))
            .or_insert(m.store_timestamp);
        *at = (*at).min(m.store_timestamp);
    }
    let mut last: HashMap<&str, (u64, i64)> = HashMap::new();
    for ((key, id), at) in first {
        if let Some((older, older_at)) = last.insert(key, (id, at)) {
            assert!(
                older_at <= at,
                "{key}: row {id} was stored at {at}, before the older row {older} (stored at \
                 {older_at})"
            );
        }
    }
}
