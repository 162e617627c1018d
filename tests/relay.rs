//! The CDC relay end to end: real MariaDB binlog → relay → real RocketMQ broker → a consumer.

mod common;

use common::relay::{
    count_status, current_position, relay_config, seed_checkpoint, wait_for, RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use outbox_relay::devenv::TopicReader;
use outbox_relay::producer::{NewEvent, Outbox};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// Writes `per_writer` events from each of `writers` concurrent writers; key `k` belongs to writer
/// `k % writers`, so each key's commit order is its id order. Returns (event_id, key) by id.
async fn write_events(db: &TestDb, topic: &str, writers: usize, per_writer: usize, keys: usize) {
    let tasks = (0..writers).map(|w| {
        let pool = db.pool.clone();
        let topic = topic.to_string();
        tokio::spawn(async move {
            let outbox = Outbox::default();
            let mut written = 0;
            let mut n = 0usize;
            while written < per_writer {
                let size = 1 + n % 5;
                let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
                let batch: Vec<NewEvent> = (0..size.min(per_writer - written))
                    .map(|i| {
                        let key = (w + writers * ((n * 7 + i * 13) % (keys / writers))) % keys;
                        NewEvent::new(
                            topic.clone(),
                            format!("key-{key}"),
                            json!({"w": w, "n": n, "i": i}),
                        )
                    })
                    .collect();
                written += batch.len();
                outbox.enqueue_batch(&mut tx, batch).await.unwrap();
                tx.commit().await.unwrap();
                n += 1;
            }
        })
    });
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_event_arrives_in_key_order_and_is_marked_sent() {
    let db = TestDb::migrated("relay_e2e").await;
    let topic = new_topic("relay_e2e");
    let (config, _dir) = relay_config(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;

    const TOTAL: usize = 10_000;
    write_events(&db, &topic, 4, TOTAL / 4, 500).await;
    wait_for("every row SENT", Duration::from_secs(180), || async {
        count_status(&db, 2).await == TOTAL as u64
    })
    .await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.sent, TOTAL as u64);
    assert_eq!(summary.marked.failed, 0);

    let rows: Vec<(u64, String, String, Option<String>)> = db
        .conn()
        .await
        .query("SELECT id, event_id, biz_key, msg_id FROM outbox_event ORDER BY id")
        .await
        .unwrap();
    assert!(
        rows.iter()
            .all(|r| r.3.as_deref().is_some_and(|m| !m.is_empty())),
        "a SENT row lacks its msg_id"
    );

    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &topic)
        .await
        .unwrap();
    let messages = reader
        .read_at_least(TOTAL, Duration::from_secs(120))
        .await
        .unwrap();
    let arrived: HashSet<&str> = messages
        .iter()
        .map(|m| m.properties["event_id"].as_str())
        .collect();
    let expected: HashSet<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(arrived, expected, "every event_id arrives");
    println!("duplicates: {}", messages.len() - arrived.len());

    // Per key: one queue, and arrival (queue offset) order equals commit (id) order.
    let id_of: HashMap<&str, u64> = rows.iter().map(|r| (r.1.as_str(), r.0)).collect();
    let mut by_key: BTreeMap<&str, Vec<(i32, i64, u64)>> = BTreeMap::new();
    for m in &messages {
        let key = m.properties["biz_key"].as_str();
        by_key.entry(key).or_default().push((
            m.queue_id,
            m.queue_offset,
            id_of[m.properties["event_id"].as_str()],
        ));
        assert_eq!(
            m.keys,
            vec![m.properties["event_id"].clone(), key.to_string()],
            "KEYS = event_id biz_key"
        );
    }
    for (key, mut seen) in by_key {
        let queues: HashSet<i32> = seen.iter().map(|s| s.0).collect();
        assert_eq!(queues.len(), 1, "{key} went to several queues");
        seen.sort_by_key(|s| s.1);
        let ids: Vec<u64> = seen.iter().map(|s| s.2).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        let mut first_seen = ids.clone();
        let mut seen_set = HashSet::new();
        first_seen.retain(|id| seen_set.insert(*id));
        assert_eq!(first_seen, sorted, "{key} arrived out of commit order");
    }
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_stay_pending_while_the_relay_is_stopped_and_flow_after_it_starts() {
    let db = TestDb::migrated("relay_stopped").await;
    let topic = new_topic("relay_stopped");
    let (config, _dir) = relay_config(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    write_events(&db, &topic, 1, 50, 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count_status(&db, 0).await,
        50,
        "nothing sends them while the relay is down"
    );

    let relay = RunningRelay::start(&config).await;
    wait_for("50 rows SENT", Duration::from_secs(60), || async {
        count_status(&db, 2).await == 50
    })
    .await;
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
