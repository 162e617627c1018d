//! Isolation on a real broker: a topic made read-only (`mqadmin updateTopicPerm -p 4`, what an
//! operator does to drain a topic and what a broker does when its disk is nearly full) holds
//! back only its own events. A second topic written at the same rate keeps flowing; the stuck
//! topic's events wait (in memory, then parked as PENDING rows for the sweeper) and are
//! delivered in key order once it is writable again. Judged by what the broker stored. (The
//! same with a frozen broker group is in `cluster`, which starts clusters of two groups.)

use crate::common::relay::{
    assert_key_order, assert_msg_ids_stored, count_status, relay_fixture, wait_for, RunningRelay,
};
use crate::common::rocketmq::{new_topic, rocketmq};
use crate::common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::devenv::rocketmq::CLUSTER_NAME;
use rocketmq_outbox::devenv::TopicReader;
use rocketmq_outbox::outbox::Status;
use rocketmq_outbox::producer::{NewEvent, Outbox};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sets `topic`'s permission on the binary's cluster: 4 read-only, 6 read-write.
fn set_permission(topic: &str, perm: &str) {
    rocketmq()
        .mqadmin(&[
            "updateTopicPerm",
            "-c",
            CLUSTER_NAME,
            "-t",
            topic,
            "-p",
            perm,
        ])
        .expect("mqadmin updateTopicPerm");
}

/// Writes one event per transaction, alternating between `topics`, `per_second` in all, until
/// `stop`; keys `k0..k9` per topic.
pub async fn write_steadily(
    db: TestDb,
    topics: [String; 2],
    per_second: u64,
    stop: Arc<AtomicBool>,
) {
    let outbox = Outbox::default();
    let mut conn = db.conn().await;
    let every = Duration::from_micros(1_000_000 / per_second);
    let mut next = tokio::time::Instant::now();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let topic = &topics[(n % 2) as usize];
        let key = format!("{topic}-k{}", (n / 2) % 10);
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await
            .unwrap();
        let event = NewEvent::new(topic.clone(), key, json!({ "n": n }));
        outbox.enqueue(&mut tx, event).await.unwrap();
        tx.commit().await.unwrap();
        n += 1;
        next += every;
        tokio::time::sleep_until(next).await;
    }
}

/// Commit → SENT latencies (ms, database clock) of `topic`'s rows created in `[from, to)`
/// seconds since `t0` (the database's `UNIX_TIMESTAMP(NOW(3))` at the start), sorted.
pub async fn latencies(db: &TestDb, topic: &str, t0: f64, from: f64, to: f64) -> Vec<f64> {
    let rows: Vec<f64> = db
        .conn()
        .await
        .exec(
            "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, sent_at) / 1000 FROM outbox_event \
             WHERE topic = ? AND sent_at IS NOT NULL AND UNIX_TIMESTAMP(created_at) >= ? \
             AND UNIX_TIMESTAMP(created_at) < ?",
            (topic, t0 + from, t0 + to),
        )
        .await
        .unwrap();
    let mut rows = rows;
    rows.sort_by(f64::total_cmp);
    rows
}

pub fn p99(sorted: &[f64]) -> f64 {
    assert!(!sorted.is_empty(), "no latencies measured");
    sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_topic_holds_back_only_its_own_keys_and_its_events_follow_in_key_order() {
    crate::common::init_logging();
    let db = TestDb::migrated("isolation_ro").await;
    let stuck = new_topic("stuck");
    let healthy = new_topic("healthy");
    let (mut config, _dir) = relay_fixture(&db)
        .sweeper(
            Duration::from_millis(500),
            Duration::from_secs(1),
            Duration::from_secs(30),
        )
        .broker_retries(
            Duration::from_secs(3),
            Duration::from_millis(200),
            Duration::from_secs(1),
            10_000,
        )
        .at_current_end()
        .await;
    config.relay.park_after = Duration::from_secs(2);
    let relay = RunningRelay::start(&config).await;

    let t0: f64 = db
        .conn()
        .await
        .query_first("SELECT UNIX_TIMESTAMP(NOW(3))")
        .await
        .unwrap()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write_steadily(
        db.clone_handle(),
        [stuck.clone(), healthy.clone()],
        100,
        Arc::clone(&stop),
    ));
    // 8 s before the fault; the fault from when the relay's route shows the topic read-only
    // (the client refreshes routes every 30 s) for 20 s; 4 s after.
    tokio::time::sleep(Duration::from_secs(8)).await;
    set_permission(&stuck, "4");
    let stalled_since = rocketmq_outbox::metrics::relay()
        .topic_stalled_since
        .get_or_create(&rocketmq_outbox::metrics::TopicLabel {
            topic: stuck.clone(),
        })
        .clone();
    wait_for("the stuck topic stalls", Duration::from_secs(90), || {
        let since = stalled_since.get();
        async move { since > 0.0 }
    })
    .await;
    let fault = Instant::now();
    let fault_from = stalled_since.get() - t0;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let stuck_pending_during = count_pending_of(&db, &stuck).await;
    set_permission(&stuck, "6");
    let fault_lasted = fault.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::SeqCst);
    writer.await.unwrap();

    let total = db.count("outbox_event").await;
    wait_for("every row SENT", Duration::from_secs(120), || async {
        count_status(&db, Status::Sent).await == total
    })
    .await;
    let summary = relay.stop().await;
    println!("{summary:?}");

    // The healthy topic flowed during the fault as before it (both measured in this run).
    let before = latencies(&db, &healthy, t0, 1.0, 8.0).await;
    let during = latencies(&db, &healthy, t0, fault_from, fault_from + fault_lasted).await;
    let (p99_before, p99_during) = (p99(&before), p99(&during));
    println!(
        "healthy topic commit → SENT p99: {p99_before:.1} ms before the fault ({} events), \
         {p99_during:.1} ms during it ({} events); stuck topic: {stuck_pending_during} rows \
         waiting at the end of the fault",
        before.len(),
        during.len()
    );
    assert!(
        p99_during <= (2.0 * p99_before).max(p99_before + 250.0),
        "the healthy topic waited for the stuck one: p99 {p99_during:.1} ms during the fault \
         against {p99_before:.1} ms before"
    );
    // As many stuck events were written during the fault as healthy ones (the writer
    // alternates): most of them were still waiting at its end.
    assert!(
        stuck_pending_during as usize * 2 >= during.len(),
        "the stuck topic's events waited during the fault ({stuck_pending_during} of about {})",
        during.len()
    );
    assert!(
        rocketmq_outbox::metrics::relay()
            .events_parked
            .get_or_create(&rocketmq_outbox::metrics::TopicLabel {
                topic: stuck.clone()
            })
            .get()
            > 0,
        "the stuck topic's later events were parked, not held in memory"
    );

    // What the broker stored: every event of both topics, each key on one queue in commit
    // order, every SENT msg_id stored.
    for topic in [&healthy, &stuck] {
        let rows: Vec<(u64, String, String, Option<String>)> = db
            .conn()
            .await
            .exec(
                "SELECT id, event_id, biz_key, msg_id FROM outbox_event WHERE topic = ? ORDER BY id",
                (topic,),
            )
            .await
            .unwrap();
        let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), topic)
            .await
            .unwrap();
        let messages = reader
            .read_at_least(rows.len(), Duration::from_secs(60))
            .await
            .unwrap();
        reader.close().await;
        let arrived: std::collections::HashSet<&str> = messages
            .iter()
            .map(|m| m.properties["event_id"].as_str())
            .collect();
        assert_eq!(
            arrived.len(),
            rows.len(),
            "every event of {topic} is stored"
        );
        assert_msg_ids_stored(&rows, &messages);
        assert_key_order(&rows, &messages);
    }
}

async fn count_pending_of(db: &TestDb, topic: &str) -> u64 {
    db.conn()
        .await
        .exec_first(
            "SELECT COUNT(*) FROM outbox_event WHERE topic = ? AND status <> ?",
            (topic, Status::Sent.code()),
        )
        .await
        .unwrap()
        .unwrap()
}
