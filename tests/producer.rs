//! The producer API against a real MariaDB: events commit and roll back with the business
//! change, and every rejected input writes nothing.

use crate::common;

use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use rocketmq_outbox::outbox::TableName;
use rocketmq_outbox::producer::{EnqueueError, NewEvent, Outbox, Payload};
use serde_json::json;

async fn with_orders_table(db: &TestDb) {
    db.conn()
        .await
        .query_drop("CREATE TABLE orders (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL)")
        .await
        .unwrap();
}

fn event(key: &str) -> NewEvent {
    NewEvent::new(
        "order-events",
        key,
        json!({"type": "OrderPaid", "key": key}),
    )
}

#[tokio::test]
async fn rollback_leaves_neither_row_and_commit_keeps_both() {
    let db = TestDb::migrated("producer_tx").await;
    with_orders_table(&db).await;
    let outbox = Outbox::default();

    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    tx.exec_drop("INSERT INTO orders VALUES (1, 'PAID')", ())
        .await
        .unwrap();
    outbox.enqueue(&mut tx, event("order-1")).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.count("orders").await, 0);
    assert_eq!(db.count("outbox_event").await, 0, "rollback sends nothing");

    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    tx.exec_drop("INSERT INTO orders VALUES (1, 'PAID')", ())
        .await
        .unwrap();
    let id = outbox
        .enqueue(
            &mut tx,
            event("order-1")
                .with_tags("Paid")
                .with_header("trace", "t1"),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.count("orders").await, 1);
    let row: (
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        String,
        u8,
        u32,
    ) = db
        .conn()
        .await
        .exec_first(
            "SELECT event_id, biz_key, topic, tags, headers, payload, status, retry_count \
             FROM outbox_event",
            (),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.0, id.as_str());
    assert_eq!(
        (row.1.as_str(), row.2.as_str()),
        ("order-1", "order-events")
    );
    assert_eq!(row.3.as_deref(), Some("Paid"));
    let headers: serde_json::Value = serde_json::from_str(row.4.as_deref().unwrap()).unwrap();
    assert_eq!(headers, json!({"trace": "t1"}));
    let payload: serde_json::Value = serde_json::from_str(&row.5).unwrap();
    assert_eq!(payload, json!({"type": "OrderPaid", "key": "order-1"}));
    assert_eq!((row.6, row.7), (0, 0), "PENDING with no retries");
}

#[tokio::test]
async fn every_bad_input_is_a_typed_error_and_writes_nothing() {
    let db = TestDb::migrated("producer_bad").await;
    let outbox = Outbox::new(TableName::parse("outbox_event").unwrap(), 1024);
    type IsExpected = fn(&EnqueueError) -> bool;
    let cases: Vec<(NewEvent, IsExpected)> = vec![
        (NewEvent::new("", "k", json!({})), |e| {
            matches!(
                e,
                EnqueueError::Invalid(rocketmq_outbox::outbox::RuleViolation::InvalidTopic { .. })
            )
        }),
        (NewEvent::new("bad topic", "k", json!({})), |e| {
            matches!(
                e,
                EnqueueError::Invalid(rocketmq_outbox::outbox::RuleViolation::InvalidTopic { .. })
            )
        }),
        (NewEvent::new("t", "k".repeat(65), json!({})), |e| {
            matches!(
                e,
                EnqueueError::Invalid(rocketmq_outbox::outbox::RuleViolation::BizKeyTooLong { .. })
            )
        }),
        (
            NewEvent::new("t", "k", json!({"big": "x".repeat(2000)})),
            |e| matches!(e, EnqueueError::PayloadTooLarge { .. }),
        ),
        (
            NewEvent::new("t", "k", Payload::raw("{\"unclosed\": ")),
            |e| matches!(e, EnqueueError::InvalidJson(_)),
        ),
        (event("k").with_event_id("not valid"), |e| {
            matches!(
                e,
                EnqueueError::Invalid(
                    rocketmq_outbox::outbox::RuleViolation::InvalidEventId { .. }
                )
            )
        }),
    ];
    for (bad, is_expected) in cases {
        let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
        let err = outbox.enqueue(&mut tx, bad.clone()).await.unwrap_err();
        assert!(is_expected(&err), "{bad:?} gave {err}");
        tx.commit().await.unwrap();
        assert_eq!(db.count("outbox_event").await, 0, "{bad:?} wrote a row");
    }
}

#[tokio::test]
async fn duplicate_event_id_is_typed_and_leaves_the_transaction_usable() {
    let db = TestDb::migrated("producer_dup").await;
    with_orders_table(&db).await;
    let outbox = Outbox::default();
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    outbox
        .enqueue(&mut tx, event("k").with_event_id("evt-1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    tx.exec_drop("INSERT INTO orders VALUES (7, 'PAID')", ())
        .await
        .unwrap();
    let err = outbox
        .enqueue(&mut tx, event("k").with_event_id("evt-1"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EnqueueError::DuplicateEventId { event_id } if event_id == "evt-1"),
        "{err}"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        db.count("orders").await,
        1,
        "the caller's own writes survive"
    );
    assert_eq!(db.count("outbox_event").await, 1);
}

#[tokio::test]
async fn a_batch_is_all_or_nothing_and_keeps_its_order() {
    let db = TestDb::migrated("producer_batch").await;
    with_orders_table(&db).await;
    let outbox = Outbox::default();

    // Large enough for several INSERT statements; the last event collides with a stored one.
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    outbox
        .enqueue(&mut tx, event("k").with_event_id("taken"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut batch: Vec<NewEvent> = (0..1200)
        .map(|i| event(&format!("key-{}", i % 10)))
        .collect();
    batch.push(event("k").with_event_id("taken"));
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    tx.exec_drop("INSERT INTO orders VALUES (1, 'PAID')", ())
        .await
        .unwrap();
    let err = outbox.enqueue_batch(&mut tx, batch).await.unwrap_err();
    assert!(
        matches!(err, EnqueueError::DuplicateEventId { .. }),
        "{err}"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        db.count("outbox_event").await,
        1,
        "no event of the failed batch was kept"
    );
    assert_eq!(
        db.count("orders").await,
        1,
        "the caller's transaction stayed usable"
    );

    // The same id twice inside one batch is caught before any SQL.
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    let err = outbox
        .enqueue_batch(
            &mut tx,
            vec![
                event("a").with_event_id("twice"),
                event("b").with_event_id("twice"),
            ],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, EnqueueError::DuplicateEventId { .. }),
        "{err}"
    );
    tx.rollback().await.unwrap();

    // A valid batch lands in order.
    let batch: Vec<NewEvent> = (0..1200).map(|i| event(&format!("key-{i}"))).collect();
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    let ids = outbox.enqueue_batch(&mut tx, batch).await.unwrap();
    tx.commit().await.unwrap();
    let stored: Vec<String> = db
        .conn()
        .await
        .query("SELECT event_id FROM outbox_event WHERE event_id <> 'taken' ORDER BY id")
        .await
        .unwrap();
    let ids: Vec<String> = ids.into_iter().map(String::from).collect();
    assert_eq!(stored, ids);
}

#[tokio::test]
async fn events_go_to_the_configured_outbox_table() {
    let mut db = TestDb::empty("producer_tables").await;
    db.config.outbox.tables = vec!["outbox_event".into(), "billing_outbox".into()];
    let mut conn = db.conn().await;
    let report = rocketmq_outbox::schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap();
    assert_eq!(report.created_tables, vec!["billing_outbox".to_string()]);
    let outbox = Outbox::new(TableName::parse("billing_outbox").unwrap(), 1 << 20);
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    outbox.enqueue(&mut tx, event("invoice-1")).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.count("billing_outbox").await, 1);
    assert_eq!(db.count("outbox_event").await, 0);
}

#[tokio::test]
async fn a_delivery_time_is_stored_as_the_same_instant_whatever_the_session_time_zone() {
    use std::time::{Duration, UNIX_EPOCH};
    let db = TestDb::migrated("producer_deliver_at").await;
    let at = UNIX_EPOCH + Duration::from_millis(1_767_225_600_250); // 2026-01-01T00:00:00.250Z
    let mut conn = db.conn().await;
    let mut stored = Vec::new();
    for zone in ["+00:00", "+05:30", "-08:00"] {
        conn.query_drop(format!("SET time_zone = '{zone}'"))
            .await
            .unwrap();
        let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
        // A batch of a scheduled and an unscheduled event: the INSERT names the column once.
        let ids = Outbox::default()
            .enqueue_batch(&mut tx, vec![event("k").deliver_at(at), event("k")])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        for id in ids {
            let unix: Option<Option<String>> = conn
                .exec_first(
                    "SELECT CAST(UNIX_TIMESTAMP(deliver_at) AS CHAR) FROM outbox_event \
                     WHERE event_id = ?",
                    (id.as_str(),),
                )
                .await
                .unwrap();
            stored.push(unix.flatten());
        }
    }
    let scheduled = Some("1767225600.250".to_string());
    assert_eq!(
        stored,
        [
            scheduled.clone(),
            None,
            scheduled.clone(),
            None,
            scheduled,
            None
        ],
        "the instant, in every session time zone; NULL for the unscheduled one"
    );
}
