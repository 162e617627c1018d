//! The binlog in the variants each server writes, live on MariaDB or MySQL (`OUTBOX_TEST_DB`):
//! JSON payloads of every shape (MySQL stores binary JSON, MariaDB text), compressed
//! transactions (MySQL's `binlog_transaction_compression`), and GTID positions with several
//! sources: MySQL UUIDs and tags (`SET gtid_next = 'AUTOMATIC:tag'`), MariaDB domains. The
//! sweeper is off: only the stream can have published what the broker stored.

use crate::common;

use common::relay::{
    current_position, relay_fixture, seed_checkpoint, wait_until_sent, RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::{database, TestDb};
use mysql_async::prelude::*;
use outbox_devenv::{DatabaseKind, TopicReader};
use rocketmq_outbox::config::Config;
use rocketmq_outbox::producer::{NewEvent, Outbox};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

fn stream_only(db: &TestDb) -> (Config, tempfile::TempDir) {
    let (config, dir) = relay_fixture(db).stream_only().build();
    (config, dir)
}

/// Commits `events` on `conn` in one transaction, after `session` statements on it.
async fn commit(conn: &mut mysql_async::Conn, events: Vec<NewEvent>) {
    let mut tx = conn.start_transaction(Default::default()).await.unwrap();
    Outbox::default()
        .enqueue_batch(&mut tx, events)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// event_id → the stored payloads of `topic` (read until it is quiet for 3 s).
async fn stored_payloads(topic: &str) -> HashMap<String, Vec<Value>> {
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), topic)
        .await
        .unwrap();
    let messages = reader.read_all_for(Duration::from_secs(3)).await.unwrap();
    reader.close().await;
    let mut stored: HashMap<String, Vec<Value>> = HashMap::new();
    for m in messages {
        let payload = serde_json::from_slice(&m.body).expect("a JSON body");
        stored
            .entry(m.properties["event_id"].clone())
            .or_default()
            .push(payload);
    }
    stored
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_payloads_of_every_shape_arrive_as_written() {
    let db = TestDb::migrated("variants_json").await;
    let topic = new_topic("variants_json");
    let (config, _dir) = stream_only(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;

    let big_text = "ü€😀 ".repeat(419_400); // 4 MiB less 76 bytes, multi-byte text
    let payloads = [
        json!({"unicode": "Grüße, 東京, emoji 😀, quote \" backslash \\ nul-free"}),
        json!({"big": 9_007_199_254_740_993u64, "max": u64::MAX, "min": i64::MIN, "neg": -42,
               "float": -1.5e-300, "zero": 0.0}),
        json!({"nested": [[1, [2, [3, []]]], {"a": [{}]}], "empty_object": {}, "empty_array": []}),
        json!([1, "two", null, true, false]),
        json!("a bare string"),
        json!(-7),
        json!(null),
        json!({"large": big_text}),
    ];
    let mut conn = db.conn().await;
    let mut expected = HashMap::new();
    for (i, payload) in payloads.iter().enumerate() {
        let id = format!("json-{i}");
        let event =
            NewEvent::new(topic.clone(), format!("k{i}"), payload.clone()).with_event_id(&id);
        commit(&mut conn, vec![event]).await;
        // Compared as parsed from the text written (serde_json's parser without
        // `float_roundtrip` may round the last bit of a float: both sides alike).
        let as_written: Value = serde_json::from_str(&payload.to_string()).unwrap();
        expected.insert(id, as_written);
    }
    wait_until_sent(&db, payloads.len() as u64, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);

    let stored = stored_payloads(&topic).await;
    assert_eq!(stored.len(), expected.len(), "every event arrived");
    for (id, payload) in expected {
        assert_eq!(
            stored[&id],
            std::slice::from_ref(&payload),
            "{id}: the payload as written"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_transactions_are_streamed_and_resumed_after() {
    if database().kind() != DatabaseKind::MySql {
        eprintln!(
            "binlog_transaction_compression is MySQL's: the MariaDB run checks plain binlogs"
        );
    }
    let db = TestDb::migrated("variants_compressed").await;
    let topic = new_topic("variants_compressed");
    let (config, _dir) = stream_only(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let mut conn = db.conn().await;
    if database().kind() == DatabaseKind::MySql {
        conn.query_drop("SET SESSION binlog_transaction_compression = ON")
            .await
            .unwrap();
    }
    let batch = |from: usize, n: usize| -> Vec<NewEvent> {
        (from..from + n)
            .map(|i| {
                NewEvent::new(
                    topic.clone(),
                    format!("k{}", i % 7),
                    json!({"i": i, "pad": "x".repeat(200)}),
                )
                .with_event_id(format!("c-{i}"))
            })
            .collect()
    };
    let relay = RunningRelay::start(&config).await;
    for t in 0..20 {
        commit(&mut conn, batch(t * 10, 10)).await;
    }
    wait_until_sent(&db, 200, Duration::from_secs(60)).await;
    let first = relay.stop().await;
    assert_eq!(first.marked.sent, 200);
    // Written while the relay is down, read after it resumes from its checkpoint.
    for t in 20..30 {
        commit(&mut conn, batch(t * 10, 10)).await;
    }
    let relay = RunningRelay::start(&config).await;
    wait_until_sent(&db, 300, Duration::from_secs(60)).await;
    let second = relay.stop().await;
    assert_eq!(
        second.marked.sent, 100,
        "resumed after the first run's events, none again"
    );
    let stored = stored_payloads(&topic).await;
    assert_eq!(stored.len(), 300);
    assert!(
        stored.values().all(|p| p.len() == 1),
        "each event stored once"
    );
}

/// Statements that make the next transaction on `conn` carry a GTID of another source (MySQL: a
/// tag, then an explicit UUID new to the server; MariaDB: other domains), each with the statement
/// that returns to the default.
fn other_sources(kind: DatabaseKind, uuid: &str, round: usize) -> Vec<(String, String)> {
    match kind {
        DatabaseKind::MySql => vec![
            (
                "SET gtid_next = 'AUTOMATIC:orders_tag'".into(),
                "SET gtid_next = 'AUTOMATIC'".into(),
            ),
            (
                format!("SET gtid_next = '{uuid}:{}'", round + 1),
                "SET gtid_next = 'AUTOMATIC'".into(),
            ),
        ],
        DatabaseKind::MariaDb => vec![
            (
                "SET SESSION gtid_domain_id = 7".into(),
                "SET SESSION gtid_domain_id = 0".into(),
            ),
            (
                "SET SESSION gtid_domain_id = 9".into(),
                "SET SESSION gtid_domain_id = 0".into(),
            ),
        ],
    }
}

/// One event in the default source, then one in each other source; three events in all.
async fn write_round(conn: &mut mysql_async::Conn, topic: &str, uuid: &str, round: usize) {
    let event = |n: usize| {
        NewEvent::new(topic, format!("k{n}"), json!({"n": n}))
            .with_event_id(format!("g-{round}-{n}"))
    };
    commit(conn, vec![event(0)]).await;
    for (n, (set, reset)) in other_sources(database().kind(), uuid, round)
        .into_iter()
        .enumerate()
    {
        conn.query_drop(set).await.unwrap();
        commit(conn, vec![event(n + 1)]).await;
        conn.query_drop(reset).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gtid_positions_with_several_sources_resume_exactly() {
    let db = TestDb::migrated("variants_gtids").await;
    let topic = new_topic("variants_gtids");
    let (config, _dir) = stream_only(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let uuid = uuid::Uuid::now_v7().to_string();
    let mut conn = db.conn().await;
    let relay = RunningRelay::start(&config).await;
    write_round(&mut conn, &topic, &uuid, 0).await;
    wait_until_sent(&db, 3, Duration::from_secs(60)).await;
    let first = relay.stop().await;
    assert_eq!(first.marked.sent, 3);
    let checkpoint = first.checkpoint.to_string();
    let holds_every_source = match database().kind() {
        DatabaseKind::MySql => {
            checkpoint.contains(":orders_tag:") && checkpoint.contains(&format!("{uuid}:1"))
        }
        DatabaseKind::MariaDb => checkpoint.contains("7-") && checkpoint.contains("9-"),
    };
    assert!(
        holds_every_source,
        "the checkpoint holds every source: {checkpoint}"
    );
    write_round(&mut conn, &topic, &uuid, 1).await; // while the relay is down
    let relay = RunningRelay::start(&config).await;
    write_round(&mut conn, &topic, &uuid, 2).await;
    wait_until_sent(&db, 9, Duration::from_secs(60)).await;
    let second = relay.stop().await;
    assert_eq!(second.marked.sent, 6, "resumed exactly past the first run");
    let stored = stored_payloads(&topic).await;
    assert_eq!(stored.len(), 9);
    assert!(
        stored.values().all(|p| p.len() == 1),
        "each event stored once"
    );
}
