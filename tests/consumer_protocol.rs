//! The idempotent transaction protocol and the guards against a real MariaDB, calling
//! `IdempotentProcessor::process` directly (the broker side is in tests/consumer.rs).

use crate::common;

use common::ledger::{ledger_db, wait_for_lock_wait, Failure, Ledger};
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use rocketmq_outbox::consumer::{
    ConsumedEvent, ConsumerMetrics, DedupStatus, Disposition, IdempotentProcessor, StateGuard,
    StateMachine, Transition, VersionCheck, VersionGuard,
};
use rocketmq_outbox::test_utils::wait_notified;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn credit(event_id: &str) -> ConsumedEvent {
    ConsumedEvent::new(
        "credits",
        json!({"account": "acct-1", "amount": 5}).to_string(),
    )
    .with_property("event_id", event_id)
    .with_property("biz_key", "acct-1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_panics_and_timeouts_roll_back_the_mark_and_the_business_write() {
    let db = ledger_db("protocol_failures").await;
    let ledger = Arc::new(Ledger::new("p"));
    let processor = IdempotentProcessor::new(db.pool.clone(), "failures", Arc::clone(&ledger))
        .unwrap()
        .with_handler_timeout(Duration::from_millis(300));
    let cases = [
        (Failure::Retry, "planned retry"),
        (Failure::Error, "handler error: planned error"),
        (Failure::Panic, "handler panicked: planned panic"),
        (Failure::Hang, "did not finish within 300ms"),
    ];
    for (i, (failure, expected)) in cases.into_iter().enumerate() {
        let event = credit(&format!("ev-{i}"));
        ledger.fail(&format!("ev-{i}"), 1, failure);
        match processor.process(&event).await {
            Disposition::Retry { reason } => {
                assert!(reason.contains(expected), "{failure:?}: {reason}")
            }
            other => panic!("{failure:?} must be a retry, got {other:?}"),
        }
        assert_eq!(
            db.count("event_dedup").await,
            i as u64,
            "{failure:?} left a mark"
        );
        assert_eq!(
            db.count("ledger").await,
            i as u64,
            "{failure:?} left its write"
        );
        // The redelivery of the same event succeeds, exactly once.
        assert_eq!(processor.process(&event).await, Disposition::Processed);
        assert_eq!(db.count("ledger").await, i as u64 + 1);
    }
    let counts = processor.metrics().counts("failures", "credits");
    assert_eq!(
        (counts.retries, counts.processed, counts.consumed),
        (4, 4, 8)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefilter_answers_recent_duplicates_and_the_database_stays_the_truth() {
    let db = ledger_db("protocol_prefilter").await;
    let ledger = Arc::new(Ledger::new("p"));
    let with_filter = IdempotentProcessor::new(db.pool.clone(), "pre", Arc::clone(&ledger))
        .unwrap()
        .with_prefilter(100);
    let event = credit("ev-pre");
    assert_eq!(with_filter.process(&event).await, Disposition::Processed);
    assert_eq!(
        with_filter.process(&event).await,
        Disposition::Duplicate { previous: None },
        "answered from memory"
    );
    // Another instance (a restart, another pod) has an empty filter: the unique key decides.
    let fresh = IdempotentProcessor::new(db.pool.clone(), "pre", Arc::clone(&ledger)).unwrap();
    assert_eq!(
        fresh.process(&event).await,
        Disposition::Duplicate {
            previous: Some(DedupStatus::Processed)
        }
    );
    assert_eq!(ledger.calls(), 1);
    // A retried attempt is never remembered: its redelivery runs the handler.
    ledger.fail("ev-later", 1, Failure::Retry);
    let later = credit("ev-later");
    assert!(!with_filter.process(&later).await.is_ack());
    assert_eq!(with_filter.process(&later).await, Disposition::Processed);
    assert_eq!(with_filter.metrics().counts("pre", "credits").dedup_hits, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_attempts_serialise_on_the_dedup_key() {
    let db = ledger_db("protocol_race").await;
    let holder = Arc::new(Ledger::new("one").with_gate());
    let other = Arc::new(Ledger::new("two"));
    // Two instances, each with its own pool, as two consumer processes would have.
    let second_pool = rocketmq_outbox::db::pool(&db.config).unwrap();
    let one =
        Arc::new(IdempotentProcessor::new(db.pool.clone(), "race", Arc::clone(&holder)).unwrap());
    let two = Arc::new(IdempotentProcessor::new(second_pool, "race", Arc::clone(&other)).unwrap());
    let event = credit("ev-race");

    let first = tokio::spawn({
        let (one, event) = (Arc::clone(&one), event.clone());
        async move { one.process(&event).await }
    });
    wait_notified(
        "the first attempt inside its handler",
        Duration::from_secs(10),
        holder.gate().held(),
        |held| *held,
    )
    .await;
    let second = tokio::spawn({
        let (two, event) = (Arc::clone(&two), event.clone());
        async move { two.process(&event).await }
    });
    wait_for_lock_wait(&db, Duration::from_secs(10)).await;
    holder.gate().open();
    assert_eq!(first.await.unwrap(), Disposition::Processed);
    assert_eq!(
        second.await.unwrap(),
        Disposition::Duplicate {
            previous: Some(DedupStatus::Processed)
        }
    );
    assert_eq!(other.calls(), 0, "the second attempt never ran the handler");
    assert_eq!(db.count("ledger").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_is_not_utf8_is_quarantined_with_a_note() {
    let db = ledger_db("protocol_binary").await;
    let processor = IdempotentProcessor::new(db.pool.clone(), "bin", Ledger::new("p")).unwrap();
    let event = ConsumedEvent::new("credits", vec![0xff, 0xfe, b'{'])
        .with_property("event_id", "ev-bin")
        .with_property("trace_id", "t-1");
    assert!(matches!(
        processor.process(&event).await,
        Disposition::Rejected { reason } if reason.starts_with("payload is not JSON")
    ));
    let row: (String, String, String) = db
        .conn()
        .await
        .query_first("SELECT reason, payload, properties FROM consumer_quarantine")
        .await
        .unwrap()
        .unwrap();
    assert!(
        row.0
            .ends_with("(payload is not UTF-8; stored with replacement characters)"),
        "{row:?}"
    );
    assert_eq!(row.1, "\u{fffd}\u{fffd}{");
    let properties: serde_json::Value = serde_json::from_str(&row.2).unwrap();
    assert_eq!(properties, json!({"event_id": "ev-bin", "trace_id": "t-1"}));
}

/// An update of `order-1` from a producer outside this project: biz_key and event type, and no
/// `event_id` property; the payload carries `event_id` when `id` is given.
fn foreign_update(n: i64, id: Option<&str>) -> ConsumedEvent {
    let mut body = json!({"account": "order-1", "amount": n});
    if let Some(id) = id {
        body["event_id"] = json!(id);
    }
    ConsumedEvent::new("credits", body.to_string())
        .with_property("biz_key", "order-1")
        .with_property("event_type", "OrderUpdated")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_events_of_one_key_and_type_without_event_id_are_never_taken_for_duplicates() {
    // With biz_key + type as the fallback key the second update was a "duplicate": ACKed, never
    // processed (the article's swallowed message).
    let db = ledger_db("protocol_fallback").await;
    let ledger = Arc::new(Ledger::new("p"));
    let processor =
        IdempotentProcessor::new(db.pool.clone(), "fallback", Arc::clone(&ledger)).unwrap();
    // The payload's event_id tells them apart: both processed, each once.
    for (n, id) in [(1, "u-1"), (2, "u-2"), (1, "u-1")] {
        processor.process(&foreign_update(n, Some(id))).await;
    }
    let marks: Vec<(String, String)> = db
        .conn()
        .await
        .query("SELECT event_id, status FROM event_dedup ORDER BY event_id")
        .await
        .unwrap();
    let processed = |id: &str| (id.to_string(), "PROCESSED".to_string());
    assert_eq!(marks, [processed("u-1"), processed("u-2")]);
    assert_eq!(db.count("ledger").await, 2, "each update applied once");

    // Without any event id: both quarantined with the reason, neither processed nor swallowed.
    for n in [3, 4] {
        let disposition = processor.process(&foreign_update(n, None)).await;
        assert!(
            matches!(&disposition, Disposition::Rejected { reason } if reason.contains("no event id")),
            "{disposition:?}"
        );
    }
    let quarantined: Vec<(Option<String>, String, String)> = db
        .conn()
        .await
        .query("SELECT event_id, reason, payload FROM consumer_quarantine ORDER BY id")
        .await
        .unwrap();
    assert_eq!(quarantined.len(), 2, "{quarantined:?}");
    for ((event_id, reason, payload), n) in quarantined.iter().zip([3, 4]) {
        assert_eq!(*event_id, None);
        assert!(
            reason.contains(r#"biz_key "order-1", type "OrderUpdated""#),
            "{reason}"
        );
        assert!(reason.contains("must send a unique event id"), "{reason}");
        assert!(payload.contains(&format!(r#""amount":{n}"#)), "{payload}");
    }
    assert_eq!(
        db.count("event_dedup").await,
        2,
        "no mark for an unkeyed message"
    );
    assert_eq!((db.count("ledger").await, ledger.calls()), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_guard_applies_only_newer_versions() {
    let db = TestDb::migrated("guard_version").await;
    let mut conn = db.conn().await;
    conn.query_drop(
        "CREATE TABLE profile (id BIGINT PRIMARY KEY, name VARCHAR(32), version BIGINT)",
    )
    .await
    .unwrap();
    conn.query_drop("INSERT INTO profile VALUES (1, 'v5', 5)")
        .await
        .unwrap();
    drop(conn);
    let metrics = ConsumerMetrics::new();
    let guard = VersionGuard::new("profile", "id", "version")
        .unwrap()
        .with_metrics(metrics.clone());

    let mut results = Vec::new();
    for (id, version) in [(1, 7), (1, 6), (1, 7), (2, 1)] {
        let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
        let check = guard.check(&mut tx, id, version).await.unwrap();
        match check {
            VersionCheck::Newer { .. } => tx
                .exec_drop(
                    "UPDATE profile SET name = ?, version = ? WHERE id = ?",
                    (format!("v{version}"), version, id),
                )
                .await
                .unwrap(),
            VersionCheck::Missing => tx
                .exec_drop(
                    "INSERT INTO profile VALUES (?, ?, ?)",
                    (id, format!("v{version}"), version),
                )
                .await
                .unwrap(),
            VersionCheck::Stale { .. } => {}
        }
        tx.commit().await.unwrap();
        results.push(check);
    }
    assert_eq!(
        results,
        [
            VersionCheck::Newer { stored: 5 },
            VersionCheck::Stale { stored: 7 }, // an older event arriving late
            VersionCheck::Stale { stored: 7 }, // the same version again
            VersionCheck::Missing,
        ]
    );
    let rows: Vec<(i64, String, i64)> = db
        .conn()
        .await
        .query("SELECT * FROM profile ORDER BY id")
        .await
        .unwrap();
    assert_eq!(rows, [(1, "v7".into(), 7), (2, "v1".into(), 1)]);
    assert_eq!(metrics.guard_ignored("version", "stale"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_guard_ignores_repeated_and_illegal_transitions() {
    let db = TestDb::migrated("guard_state").await;
    db.conn()
        .await
        .query_drop("CREATE TABLE orders (id BIGINT PRIMARY KEY, state VARCHAR(16)); INSERT INTO orders VALUES (1, 'CREATED')")
        .await
        .unwrap();
    let metrics = ConsumerMetrics::new();
    let machine = StateMachine::new([
        ("CREATED", "PAID"),
        ("PAID", "SHIPPED"),
        ("CREATED", "CANCELLED"),
    ]);
    let guard = StateGuard::new(machine, "orders", "id", "state")
        .unwrap()
        .with_metrics(metrics.clone());

    let mut results = Vec::new();
    for (id, to) in [
        (1, "PAID"),
        (1, "PAID"),
        (1, "CANCELLED"),
        (1, "SHIPPED"),
        (9, "PAID"),
    ] {
        let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
        results.push(guard.apply(&mut tx, id, to).await.unwrap());
        tx.commit().await.unwrap();
    }
    assert_eq!(
        results,
        [
            Transition::Apply,
            Transition::Repeated,
            Transition::Illegal {
                from: "PAID".into(),
                to: "CANCELLED".into()
            },
            Transition::Apply,
            Transition::Missing,
        ]
    );
    let state: Option<String> = db
        .conn()
        .await
        .query_first("SELECT state FROM orders WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(state.as_deref(), Some("SHIPPED"));
    for reason in ["repeated", "illegal", "missing"] {
        assert_eq!(metrics.guard_ignored("state", reason), 1, "{reason}");
    }
}
